"""The OpenAI routes in process (FastAPI's TestClient), over the engine and a fake context:
the whole path from a request's body to its answer — parsing, checks, the spec, the
request built and run on the engine thread, the outputs rendered — without a model."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.unit.fake_context import BOS, FakeModel, expected


def letters(tokens: list[int]) -> str:
    return FakeModel().text(tokens)


def test_a_greedy_completion_with_n_choices_is_the_engine_s_text(client: TestClient) -> None:
    response = client.post(
        "/v1/completions",
        json={"prompt": "story", "n": 3, "max_tokens": 5, "temperature": 0, "top_k": 8},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    want = letters(expected([BOS, *FakeModel.tokens("story")], 0, 5))
    assert [c["text"] for c in body["choices"]] == [want] * 3
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        6,
        15,
        21,
    )


def test_a_stream_sends_each_choice_then_done(client: TestClient) -> None:
    body = {"prompt": "tale", "n": 2, "max_tokens": 4, "temperature": 0, "top_k": 8, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    texts: dict[int, str] = {}
    for chunk in map(json.loads, data[:-1]):
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    want = letters(expected([BOS, *FakeModel.tokens("tale")], 0, 4))
    assert texts == {0: want, 1: want}


def test_bad_input_is_a_400_that_names_the_parameter(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": "x", "n": 9})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "n" and "between 1 and 8" in error["message"]
    response = client.post("/v1/completions", json={"prompt": [5, 99], "top_k": 8})
    assert response.status_code == 400 and "99" in response.json()["error"]["message"]

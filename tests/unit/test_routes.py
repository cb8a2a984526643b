"""The generating routes in process (FastAPI's TestClient), over the engine and a fake
context behind the face the loader builds (served.py; tests/unit/conftest.py): the whole
path from a request's body to its answer — parsing, checks, the spec, the request built and
run on the engine thread, the outputs rendered — without a model. Every generating route:
its answer, its stream, and a 400 that says what was wrong, in its API's own shape."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.unit.fake_context import BOS, FakeModel, expected

GREEDY = {"temperature": 0, "top_k": 8}  # top_k: the fake vocabulary has 28 tokens


def letters(tokens: list[int]) -> str:
    return FakeModel().text(tokens)


def greedy_text(prompt: str, steps: int) -> str:
    """What a greedy branch writes after `prompt` (its BOS first) in `steps` tokens."""
    return letters(expected([BOS, *FakeModel.tokens(prompt)], 0, steps))


def events(client: TestClient, path: str, body: dict[str, Any]) -> list[str]:
    """A stream's `data:` payloads."""
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


# -- /v1/completions ----------------------------------------------------------------------


def test_a_greedy_completion_with_n_choices_is_the_engine_s_text(client: TestClient) -> None:
    response = client.post(
        "/v1/completions", json={"prompt": "story", "n": 3, "max_tokens": 5, **GREEDY}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["text"] for c in body["choices"]] == [greedy_text("story", 5)] * 3
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        6,
        15,
        21,
    )


def test_a_stream_sends_each_choice_then_done(client: TestClient) -> None:
    data = events(
        client,
        "/v1/completions",
        {"prompt": "tale", "n": 2, "max_tokens": 4, "stream": True, **GREEDY},
    )
    assert data[-1] == "[DONE]"
    texts: dict[int, str] = {}
    for chunk in map(json.loads, data[:-1]):
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    want = greedy_text("tale", 4)
    assert texts == {0: want, 1: want}


def test_bad_input_is_a_400_that_names_the_parameter(client: TestClient) -> None:
    response = client.post("/v1/completions", json={"prompt": "x", "n": 9})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "n" and "between 1 and 8" in error["message"]
    response = client.post("/v1/completions", json={"prompt": [5, 99], "top_k": 8})
    assert response.status_code == 400 and "99" in response.json()["error"]["message"]


# -- /v1/chat/completions -------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hello"}]  # the fake template: "hello " on the BOS


def test_a_chat_completion_is_the_engine_s_text_as_the_assistant_s(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "n": 2, "max_tokens": 4, **GREEDY}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    messages = [c["message"] for c in body["choices"]]
    assert messages == [{"role": "assistant", "content": greedy_text("hello", 4)}] * 2
    assert body["usage"]["prompt_tokens"] == 6


def test_a_chat_stream_sends_the_role_then_the_text_then_done(client: TestClient) -> None:
    data = events(
        client,
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 3, "stream": True, **GREEDY},
    )
    assert data[-1] == "[DONE]"
    deltas = [json.loads(d)["choices"][0]["delta"] for d in data[:-1]]
    assert deltas[0].get("role") == "assistant"
    assert "".join(d.get("content") or "" for d in deltas) == greedy_text("hello", 3)


def test_a_chat_without_messages_is_a_400(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": [], **GREEDY})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "top_k": 99})
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_k"


# -- llama.cpp's /completion --------------------------------------------------------------


def test_llama_cpp_s_completion_is_one_result_or_a_list(client: TestClient) -> None:
    one = client.post("/completion", json={"prompt": "story", "n_predict": 5, **GREEDY})
    assert one.status_code == 200, one.text
    result = one.json()
    assert result["content"] == greedy_text("story", 5) and result["stop"] is True
    assert (result["tokens_predicted"], result["tokens_evaluated"]) == (5, 6)
    both = client.post("/completion", json={"prompt": "story", "n": 2, "n_predict": 5, **GREEDY})
    assert [r["content"] for r in both.json()] == [greedy_text("story", 5)] * 2


def test_llama_cpp_s_stream_sends_each_token_then_the_final_result(client: TestClient) -> None:
    data = [
        json.loads(d)
        for d in events(
            client, "/completion", {"prompt": "tale", "n_predict": 4, "stream": True, **GREEDY}
        )
    ]
    assert [d["stop"] for d in data] == [False] * 4 + [True]  # no [DONE]: the stream ends
    assert "".join(d["content"] for d in data) == greedy_text("tale", 4)


def test_llama_cpp_s_bad_input_is_a_400(client: TestClient) -> None:
    response = client.post("/completion", json={"prompt": "x", "n_probs": 21, **GREEDY})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "n_probs" and "[0, 20]" in error["message"]


# -- KoboldCpp's /api/v1/generate and /api/extra/generate/stream ----------------------------


def test_koboldcpp_s_generate_is_one_result_per_branch(client: TestClient) -> None:
    body = {"prompt": "story", "n": 2, "max_length": 5, "genkey": "KCPP1234", **GREEDY}
    response = client.post("/api/v1/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["X-Genkey"] == "KCPP1234"
    results = response.json()["results"]
    assert [r["text"] for r in results] == [greedy_text("story", 5)] * 2
    assert {(r["finish_reason"], r["prompt_tokens"], r["completion_tokens"]) for r in results} == {
        ("length", 6, 5)
    }
    # The answer is over: its genkey names nothing now.
    check = client.post("/api/extra/generate/check", json={"genkey": "KCPP1234"})
    assert check.json() == {"results": [{"text": ""}]}


def test_koboldcpp_s_stream_sends_message_events(client: TestClient) -> None:
    with client.stream(
        "POST", "/api/extra/generate/stream", json={"prompt": "tale", "max_length": 4, **GREEDY}
    ) as response:
        assert response.status_code == 200
        assert len(response.headers["X-Genkey"]) == 32  # made here: 128 random bits
        lines = list(response.iter_lines())
    assert [line for line in lines if line.startswith("event: ")] == ["event: message"] * 4
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert "".join(d["token"] for d in data) == greedy_text("tale", 4)
    assert [d["finish_reason"] for d in data] == ["null"] * 3 + ["length"]


def test_koboldcpp_s_bad_input_is_a_400_in_its_shape(client: TestClient) -> None:
    response = client.post("/api/v1/generate", json={"prompt": "x", "n": 9, **GREEDY})
    assert response.status_code == 400
    assert response.json()["detail"]["type"] == "bad_input"
    assert "between 1 and 8" in response.json()["detail"]["msg"]
    stream = client.post("/api/extra/generate/stream", json={"prompt": "x", "n": 2, **GREEDY})
    assert stream.status_code == 400 and "n > 1" in stream.json()["detail"]["msg"]

"""The core promise through real HTTP: n completions of one prompt, one prefill."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers import complete
from tests.support.server import RunningServer

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"


def stream_events(server: RunningServer, **body: object) -> list[dict | str]:
    events: list[dict | str] = []
    with httpx.stream(
        "POST", f"{server.api_url}/completions", json={**body, "stream": True}, timeout=120
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_n_choices_have_distinct_indices_and_usage_counts_the_prompt_once(
    server: RunningServer,
) -> None:
    out = complete(server, prompt=STORY, n=5, max_tokens=6, seed=3)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3, 4]
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    usage = out["usage"]
    assert usage["completion_tokens"] <= 5 * 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] < 30  # counted once, not n times


def test_greedy_branches_are_identical(server: RunningServer) -> None:
    out = complete(server, prompt=STORY, n=4, max_tokens=12, temperature=0)
    texts = {c["text"] for c in out["choices"]}
    assert len(texts) == 1 and texts.pop().strip()


def test_branches_decoded_together_match_each_decoded_alone(fresh_server: RunningServer) -> None:
    server = fresh_server
    together = complete(server, prompt=STORY, n=3, max_tokens=10, seed=1234, ignore_eos=True)
    for choice in together["choices"]:
        alone = complete(
            server, prompt=STORY, n=1, max_tokens=10, seed=1234 + choice["index"], ignore_eos=True
        )
        assert alone["choices"][0]["text"] == choice["text"]


def test_same_seed_same_choices_and_choices_differ(fresh_server: RunningServer) -> None:
    """On a server of its own: the second request reads the prompt from the cache, and
    both run the same steps on every run (seeded text has no near-tie check)."""
    server = fresh_server
    body = {"prompt": STORY, "n": 4, "max_tokens": 10, "seed": 99, "temperature": 1.0}
    first = [c["text"] for c in complete(server, **body)["choices"]]
    second = [c["text"] for c in complete(server, **body)["choices"]]
    assert first == second
    assert len(set(first)) > 1


def test_max_tokens_gives_length(server: RunningServer) -> None:
    out = complete(server, prompt=STORY, n=2, max_tokens=3, ignore_eos=True)
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    assert out["usage"]["completion_tokens"] == 6


def test_stop_strings_never_leak_even_split_across_tokens(fresh_server: RunningServer) -> None:
    server = fresh_server
    base = complete(server, prompt=STORY, max_tokens=24, temperature=0, ignore_eos=True)
    text = base["choices"][0]["text"]
    # A stop string that starts inside one token and ends inside a later one.
    start = len(text) // 2
    stop = text[start - 2 : start + 3]
    expected = text[: text.find(stop)]
    out = complete(server, prompt=STORY, max_tokens=24, temperature=0, stop=[stop, "zzzq"])
    assert out["choices"][0]["text"] == expected
    assert out["choices"][0]["finish_reason"] == "stop"
    events = stream_events(server, prompt=STORY, max_tokens=24, temperature=0, stop=stop, n=2)
    for index in (0, 1):
        streamed = "".join(
            c["text"]
            for e in events
            if isinstance(e, dict)
            for c in e["choices"]
            if c["index"] == index
        )
        assert streamed == expected


def test_min_tokens_suppresses_stops_until_reached(server: RunningServer) -> None:
    base = complete(server, prompt=STORY, max_tokens=12, temperature=0, ignore_eos=True)
    first_word = base["choices"][0]["text"].split()[0]
    out = complete(
        server, prompt=STORY, max_tokens=12, temperature=0, stop=first_word, min_tokens=8
    )
    assert out["choices"][0]["text"].startswith(base["choices"][0]["text"][:4])
    assert out["usage"]["completion_tokens"] >= 8


def test_stream_delivers_every_index_then_usage_then_done(server: RunningServer) -> None:
    events = stream_events(
        server, prompt=STORY, n=3, max_tokens=5, stream_options={"include_usage": True}
    )
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert isinstance(usage_chunk, dict) and usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] > 0
    finished = {
        c["index"]: c["finish_reason"]
        for e in events[:-2]
        if isinstance(e, dict)
        for c in e["choices"]
        if c["finish_reason"]
    }
    assert sorted(finished) == [0, 1, 2]


def test_twelve_concurrent_requests_with_n3_all_complete(server: RunningServer) -> None:
    def one(i: int) -> dict:
        return complete(server, prompt=f"{STORY} ({i})", n=3, max_tokens=8, seed=i)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    for out in results:
        assert len(out["choices"]) == 3
        assert all(c["finish_reason"] in ("stop", "length") for c in out["choices"])


def test_the_prompt_is_evaluated_once_for_n_8(server: RunningServer) -> None:
    prompt = f"{uuid.uuid4().hex} {STORY * 8}"  # nothing of it is cached yet
    before = server.metric("llama_srb_prompt_tokens_evaluated_total")
    out = complete(server, prompt=prompt, n=8, max_tokens=4)
    evaluated = server.metric("llama_srb_prompt_tokens_evaluated_total") - before
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached <= 1  # at most the BOS token is shared with earlier prompts
    assert evaluated == out["usage"]["prompt_tokens"] - cached
    assert len(out["choices"]) == 8


def test_metrics_count_the_host_time_outside_llama_decode(server: RunningServer) -> None:
    steps_before = server.metric("llama_srb_host_step_seconds_count")
    complete(server, prompt=STORY, n=4, max_tokens=6, ignore_eos=True)
    metrics = server.metrics()
    assert metrics["llama_srb_host_step_seconds_count"] - steps_before >= 6  # a step a token
    assert (
        0
        < metrics["llama_srb_host_step_seconds_sum"]
        < metrics["llama_srb_decode_seconds_total"] * 100
    )


def test_models_and_health(server: RunningServer) -> None:
    models = httpx.get(f"{server.api_url}/models").json()
    assert models["object"] == "list" and models["data"][0]["id"]
    assert httpx.get(f"{server.base_url}/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 10_000}, "n"),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 9_000}, "max_tokens"),
        ({"prompt": "x", "model": "no-such-model"}, "model"),
        ({"prompt": 42}, "prompt"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "top_p": 3}, "top_p"),
        ({"n": 2}, "prompt"),
        ({"prompt": "x", "stop": ""}, "stop"),
    ],
)
def test_bad_input_is_a_4xx_error_object(server: RunningServer, body: dict, param: str) -> None:
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=30)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"] and error["type"]


def test_malformed_json_is_a_400(server: RunningServer) -> None:
    response = httpx.post(
        f"{server.api_url}/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


def test_prompt_too_long_names_the_numbers(server: RunningServer) -> None:
    response = httpx.post(
        f"{server.api_url}/completions", json={"prompt": STORY * 700, "max_tokens": 100}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "8192" in error["message"]
    # ...and the server keeps serving.
    assert complete(server, prompt=STORY, max_tokens=2)["choices"]

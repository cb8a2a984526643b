"""Completions' logprobs and echo: shapes, values, streaming, and the prompt's own scores."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tests.helpers import complete
from tests.support.paths import TIE, assert_same_greedy, completion_steps
from tests.support.server import RunningServer

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"


def test_logprobs_shape_and_values_at_temperature_0(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
    out = client.completions.create(
        model=server.model_id,
        prompt=STORY,
        n=2,
        max_tokens=6,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    for choice in out.choices:
        lp = choice.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
        assert lp.text_offset is not None
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
        assert "".join(lp.tokens) == choice.text
        # Offsets index the choice's own text (vLLM, TabbyAPI; SillyTavern cuts tokens
        # out of `text` with them): each token is found where its offset says.
        expected = [len("".join(lp.tokens[:i])) for i in range(6)]
        assert lp.text_offset == expected
        assert all(choice.text[o:].startswith(t) for o, t in zip(expected, lp.tokens, strict=True))
        for sampled, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
            assert sampled is not None and sampled <= 0 and top is not None
            assert max(top.values()) >= sampled - 1e-6  # greedy: the top-1 is the sampled one
            assert max(top.values()) == pytest.approx(sampled)
            assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
            assert 3 <= len(top) <= 4  # the top 3, plus the sampled token if not among them


def test_logprobs_are_of_the_model_not_the_sampler_chain(server: RunningServer) -> None:
    # top_k=1 leaves one candidate: after the chain its probability would be 1 (logprob 0).
    sure = "Counting: 1, 2, 3, 4, 5, 6, 7,"  # no near tie: the two texts are compared
    greedy = complete(server, prompt=sure, max_tokens=3, temperature=0, logprobs=2)
    top1 = complete(server, prompt=sure, max_tokens=3, temperature=0.7, top_k=1, logprobs=2)
    a, b = (completion_steps(out["choices"][0]) for out in (greedy, top1))
    assert_same_greedy(a, b, at_least=3)  # the second reads the prompt from the cache
    assert all(step.logprob < 0 for step in a + b)


def test_no_logprobs_unless_asked(server: RunningServer) -> None:
    out = complete(server, prompt=STORY, n=2, max_tokens=3)
    assert all(c["logprobs"] is None for c in out["choices"])


def test_echo_returns_the_prompt_first(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
    body = {"model": server.model_id, "prompt": STORY, "max_tokens": 1, "temperature": 0}
    out = client.completions.create(**body, n=2, echo=True)
    plain = client.completions.create(**body, logprobs=2)
    (step,) = completion_steps(plain.choices[0].model_dump())
    for choice in out.choices:
        assert choice.text.startswith(STORY) and len(choice.text) > len(STORY)
        if step.margin >= TIE:  # the other read's token, unless it was a near tie
            assert choice.text == STORY + plain.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_tokens(server: RunningServer) -> None:
    prompt = f"Echoed. {STORY}"  # read by no other test: one prefill, shared
    out = complete(server, prompt=prompt, n=2, max_tokens=2, temperature=0, echo=True, logprobs=2)
    n_prompt = out["usage"]["prompt_tokens"]
    for choice in out["choices"]:
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == n_prompt + 2
        assert choice["text"] == prompt + "".join(lp["tokens"][n_prompt:])
        assert (
            lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        )  # nothing before it
        assert lp["text_offset"][0] == 0 and lp["text_offset"][n_prompt] == len(prompt)
        for value, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
            assert value is not None and value <= 0
            assert max(top.values()) >= value - 1e-6
            assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    assert out["choices"][0]["logprobs"] == out["choices"][1]["logprobs"]  # one prefill, shared


def test_echo_scores_a_prompt_seen_before_just_the_same(server: RunningServer) -> None:
    body = {"prompt": STORY, "max_tokens": 0, "echo": True, "logprobs": 1}
    first, second = complete(server, **body), complete(server, **body)
    assert first["choices"][0]["text"] == STORY
    scores = first["choices"][0]["logprobs"]["token_logprobs"]
    assert scores[0] is None and all(v is not None for v in scores[1:])
    assert second["choices"][0]["logprobs"] == first["choices"][0]["logprobs"]


def test_streamed_logprobs_match_the_collected_ones(fresh_server: RunningServer) -> None:
    server = fresh_server  # compares two requests' greedy tokens exactly
    body = {"prompt": STORY, "n": 2, "max_tokens": 5, "temperature": 0, "logprobs": 2}
    collected = complete(server, **body, ignore_eos=True)
    tokens: dict[int, list[str]] = {0: [], 1: []}
    offsets: dict[int, list[int]] = {0: [], 1: []}
    with httpx.stream(
        "POST",
        f"{server.api_url}/completions",
        json={**body, "stream": True, "ignore_eos": True},
        timeout=120,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    if c["logprobs"]:
                        tokens[c["index"]] += c["logprobs"]["tokens"]
                        offsets[c["index"]] += c["logprobs"]["text_offset"]
    for choice in collected["choices"]:
        assert tokens[choice["index"]] == choice["logprobs"]["tokens"]
        assert offsets[choice["index"]] == choice["logprobs"]["text_offset"]


@pytest.mark.parametrize("logprobs", [-1, 21, "many"])
def test_bad_logprobs_are_a_400(server: RunningServer, logprobs: object) -> None:
    response = httpx.post(
        f"{server.api_url}/completions", json={"prompt": "x", "logprobs": logprobs}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "logprobs"

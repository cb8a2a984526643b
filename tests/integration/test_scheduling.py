"""Scheduling with the real model: a long prompt prefilled beside a running stream under a
tight step budget, steps cut into several llama_decode calls, and the metrics that show
where requests wait and how streams flow.

Gemma only: the scheduler does not depend on the model, and each server costs a start."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.support.server import RunningServer, run_server

pytestmark = pytest.mark.models(GEMMA)

STORY = "The harbor lantern swung in the storm while the keeper counted the boats. "


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    """A tight step budget and few sequences: long prompts go in small chunks beside
    streams, and a third request of n=2 waits for sequence ids (no reserve for small
    requests, which would take it). Calls of at most 3 tokens: two requests of n=2 decode
    in two calls a step."""
    args = ["--model", bundled_model, "--n-ctx", "8192", "--max-sequences", "4", "--max-n", "4"]
    args += ["--reserve-sequences", "0"]
    pacing = ("--step-budget", "0.02", "--tokens-per-call", "3")
    with run_server(tmp_path_factory.mktemp("paced"), *args, *pacing) as s:
        yield s


async def stream_text(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> list[str]:
    texts = ["", ""]
    async with http.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line.removeprefix("data: "))["choices"]:
                    texts[choice["index"]] += choice["text"]
    return texts


def test_a_long_prompt_is_chunked_beside_a_stream_and_both_complete(paced: RunningServer) -> None:
    url = f"{paced.base_url}/v1/completions"
    gaps_before = paced.metric("llama_srb_token_gap_seconds_count")
    waits_before = paced.metric("llama_srb_queue_wait_seconds_count")
    stream_body = {"prompt": "Once upon a time", "n": 2, "max_tokens": 40, "seed": 7}
    stream_body["ignore_eos"] = True
    long_body = {"prompt": STORY * 60, "max_tokens": 8, "seed": 3}

    async def together() -> tuple[list[str], httpx.Response]:
        async with httpx.AsyncClient(timeout=600) as http:
            streamed = asyncio.create_task(stream_text(http, url, stream_body))
            await asyncio.sleep(0.2)  # the stream is running when the long prompt arrives
            long = await http.post(url, json=long_body)
            return await streamed, long

    streamed, long = asyncio.run(together())
    assert long.status_code == 200 and long.json()["usage"]["prompt_tokens"] > 600
    assert all(streamed)
    # Every token of the stream after its first is one gap (the long request's 8 more).
    gaps = paced.metric("llama_srb_token_gap_seconds_count") - gaps_before
    assert gaps >= 39
    assert paced.metric("llama_srb_queue_wait_seconds_count") - waits_before == 2


def test_requests_beyond_max_sequences_wait_and_the_metrics_say_why(
    paced: RunningServer,
) -> None:
    url = f"{paced.base_url}/v1/completions"
    short_before = paced.metric('llama_srb_admission_short_steps_total{lacking="sequences"}')

    async def three() -> list[httpx.Response]:
        body = {"prompt": "A dragon", "n": 2, "max_tokens": 24, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=600) as http:
            return await asyncio.gather(*(http.post(url, json=body) for _ in range(3)))

    responses = asyncio.run(three())
    assert all(r.status_code == 200 and len(r.json()["choices"]) == 2 for r in responses)
    # Four sequences for three requests of two: one waited while the others decoded.
    short_after = paced.metric('llama_srb_admission_short_steps_total{lacking="sequences"}')
    assert short_after > short_before
    assert paced.metric("llama_srb_sequences_running") == 0


def test_a_step_too_big_for_one_call_goes_in_several_and_every_branch_completes(
    paced: RunningServer,
) -> None:
    url = f"{paced.base_url}/v1/completions"
    steps_before = paced.metric("llama_srb_decode_steps_total")
    calls_before = paced.metric("llama_srb_decode_step_seconds_count")

    async def two() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=600) as http:
            return await asyncio.gather(
                *(
                    http.post(
                        url,
                        json={
                            "prompt": prompt,
                            "n": 2,
                            "max_tokens": 12,
                            "seed": 5,
                            "ignore_eos": True,
                            "logprobs": 1,
                        },
                    )
                    for prompt in ("The old mill", "Across the bay")
                )
            )

    for response in asyncio.run(two()):
        assert response.status_code == 200
        out = response.json()
        assert out["usage"]["completion_tokens"] == 24
        for choice in out["choices"]:  # logprobs read each call's rows before the next
            assert choice["finish_reason"] == "length"
            assert len(choice["logprobs"]["tokens"]) == 12
    steps = paced.metric("llama_srb_decode_steps_total") - steps_before
    calls = paced.metric("llama_srb_decode_step_seconds_count") - calls_before
    assert calls >= steps + 8  # most of the 12 steps of two requests of two made two calls

"""Greedy text from two computation paths, compared so that the test holds by construction.

llama.cpp's CPU kernels round differently for other batch shapes and for cells in other
places of the KV cache, so the same greedy request read cold, from the prefix cache or
from a cache tier gets logprobs a little apart (up to DRIFT, measured by
bench/bench_drift.py on both bundled models). Where the two most likely tokens are closer
than TIE, either side may take either, and everything after it may part. So two greedy
runs must write the same tokens until the first step where either side saw a near tie,
and the logprobs of those tokens must agree within DRIFT; after that step nothing is
compared. A test states how many steps it needs compared (`at_least`): its prompt is
fixed, so whether its first steps are near ties is a property of the prompt and the
model, checked here on every run, not a matter of chance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DRIFT = 0.5  # nats: the most a token's logprob moved between paths was 0.41 (Gemma 3)
TIE = 2 * DRIFT  # a margin two drifts wide cannot be crossed by them


@dataclass(frozen=True)
class Step:
    token: str | int
    logprob: float
    margin: float  # the most likely token's logprob less the second's (inf: no second)


def completion_steps(choice: dict[str, Any]) -> list[Step]:
    """The steps of a /v1/completions choice asked with `logprobs` ≥ 2."""
    logprobs = choice["logprobs"]
    return [
        Step(token, logprob, _margin(top.values()))
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        )
    ]


def chat_steps(choice: dict[str, Any]) -> list[Step]:
    """The steps of a /v1/chat/completions choice asked with `top_logprobs` ≥ 2."""
    return [
        Step(e["token"], e["logprob"], _margin(t["logprob"] for t in e["top_logprobs"]))
        for e in choice["logprobs"]["content"]
    ]


def native_steps(body: dict[str, Any]) -> list[Step]:
    """The steps of a llama.cpp /completion answer asked with `n_probs` ≥ 2."""
    return [
        Step(e["id"], e["logprob"], _margin(t["logprob"] for t in e["top_logprobs"]))
        for e in body["completion_probabilities"]
    ]


def _margin(logprobs: Any) -> float:
    best = sorted(logprobs, reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def assert_same_greedy(a: Sequence[Step], b: Sequence[Step], at_least: int = 1) -> int:
    """Two greedy runs agree, as explained above; the number of steps compared."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        tie = min(x.margin, y.margin) < TIE
        assert x.token == y.token or tie, f"step {i}: {x} against {y}, and no near tie"
        assert abs(x.logprob - y.logprob) <= DRIFT or x.token != y.token, f"step {i}: {x}, {y}"
        if tie:
            compared = i
            break
    else:
        assert len(a) == len(b), f"one side ended without a near tie: {len(a)} against {len(b)}"
        compared = len(a)
    assert compared >= at_least, f"only {compared} steps before a near tie: {list(a)[:8]}"
    return compared

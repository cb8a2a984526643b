"""How far one greedy request's logprobs move between computation paths, per bundled model:
the number behind the README's known limit and behind tests/support/paths.py's DRIFT.

    .venv/bin/python bench/bench_drift.py [--models gemma-3-270m,smollm2-135m-instruct]
                                          [--tokens 24]

Each of the fixed prompts is sent greedily (`logprobs: 2`) on a fresh server (cold), and
then along each other path; the table gives, over the steps where both sides had written
the same tokens so far, the largest difference of the chosen token's logprob, and how
often and at what margin between the top two the texts parted.

- same request, fresh server: a second server started alike (the baseline: expect 0)
- cached: the same request again on the first server (the prompt from the prefix cache)
- holes: again after unrelated n=8 requests left cells behind in other places
- host tier: a server whose live cache holds no path (the prompt restored from host memory)
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import BUNDLED
from tests.support.paths import Step, completion_steps
from tests.support.server import RunningServer, run_server

PROMPTS = [
    "The lighthouse keeper counted the steps as he climbed, one hundred and twelve of them.",
    "Below, the sea argued with the rocks and the gulls wheeled over the harbour. She said",
    "Chapter One\n\nThe rain had not stopped for three days when Ilse found the letter",
    "It was the last train out of the city, and every seat was taken but one:",
    "My grandmother kept bees, and every summer she sent me a jar of honey with a note",
    "The detective looked at the clock, then at the door, and finally at the",
    "Once upon a time, in a kingdom at the edge of the map, there lived a",
    "Q: What is the capital of France?\nA:",
]
FILLER = "A short unrelated note about the weather, the harvest and the price of bread."


def greedy(server: RunningServer, prompt: str, tokens: int) -> list[Step]:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "logprobs": 2}
    response = httpx.post(
        f"{server.api_url}/completions", json={**body, "ignore_eos": True}, timeout=300
    )
    response.raise_for_status()
    return completion_steps(response.json()["choices"][0])


def compare(a: list[Step], b: list[Step]) -> tuple[int, float, float | None]:
    """Steps with the same text so far, the largest logprob difference over them, and the
    margin (the smaller side's) where the texts parted, if they did."""
    drift = 0.0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.token != y.token:
            return i, drift, min(x.margin, y.margin)
        drift = max(drift, abs(x.logprob - y.logprob))
    return len(a), drift, None


def measure(model: str, tokens: int, tmp: Path) -> list[tuple[str, list[list[Step]]]]:
    def server(*args: str) -> Callable[[], object]:
        return lambda: run_server(tmp, "--model", model, "--n-ctx", "4096", *args)

    def each(running: RunningServer) -> list[list[Step]]:
        return [greedy(running, p, tokens) for p in PROMPTS]

    paths: list[tuple[str, list[list[Step]]]] = []
    with server()() as first:  # type: ignore[attr-defined]
        paths.append(("cold", each(first)))
        paths.append(("cached", each(first)))
        for i in range(4):
            body = {"prompt": f"{i}. {FILLER}", "n": 8, "max_tokens": 32, "seed": i}
            httpx.post(f"{first.api_url}/completions", json=body, timeout=300)
        paths.append(("holes", each(first)))
    with server()() as second:  # type: ignore[attr-defined]
        paths.append(("fresh server", each(second)))
    with server("--cache-cells", "0")() as tiered:  # type: ignore[attr-defined]
        each(tiered)
        paths.append(("host tier", each(tiered)))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(BUNDLED))
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    print(
        "| model | path | steps compared | largest logprob drift | parted | margins where parted |"
    )
    print("|---|---|---:|---:|---:|---|")
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            paths = measure(model, args.tokens, Path(tmp))
        cold = paths[0][1]
        for name, runs in paths[1:]:
            results = [compare(a, b) for a, b in zip(cold, runs, strict=True)]
            margins = [f"{m:.3f}" for _, _, m in results if m is not None]
            print(
                f"| {model} | {name} | {sum(n for n, _, _ in results)} |"
                f" {max(d for _, d, _ in results):.4f} | {len(margins)}/{len(results)} |"
                f" {', '.join(margins) or '-'} |"
            )
    print(f"\nreproduce: .venv/bin/python bench/bench_drift.py {shlex.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

"""Stalls: how long a running stream freezes while a long fresh prompt is prefilled.

    .venv/bin/python bench/bench_fairness.py [--budgets 0,0.15] [--prompt-tokens 4000]
                                             [--n 4] [--repeat 1] [--server-args "..."]

For each --step-budget in --budgets (0: no limit, the old behaviour), one server, in turn:
  1. a fresh ~--prompt-tokens prompt with max_tokens 1 on the idle server: its latency;
  2. a streaming n=--n request; once it has streamed for a second, another fresh prompt of
     the same length arrives (max_tokens 1). The stream's inter-token gaps (branch 0's
     SSE chunks, as the client receives them) are split into those before the long
     prompt arrived (idle) and those while it ran; the long request's latency is timed.
Prompts are random words, salted from their first token on, so no prefix cache helps.
Prints a markdown table and the command that reproduces it. Its last column is a floor no
schedule can beat: a stream whose gaps stay under STALL_BOUND must get a step at least that
often, and each costs about its idle gap of compute, so the long prompt gets at most the
rest of the machine: its latency is at least idle / (1 - idle gap / STALL_BOUND).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.server import run_server

WORDS = [
    "harbor",
    "lantern",
    "rope",
    "gull",
    "tide",
    "salt",
    "window",
    "letter",
    "stair",
    "keeper",
    "winter",
    "boat",
    "storm",
    "dawn",
    "bread",
    "oven",
    "village",
    "cliff",
    "fog",
    "bell",
    "mirror",
    "river",
    "candle",
    "orchard",
    "wolf",
    "meadow",
    "thread",
]
DEFAULT_SERVER_ARGS = "--n-ctx 16384"
# Enough for the stream to outlast the long prompt (it is cut once that is done), and
# small enough that its n x max_tokens reservation leaves the long prompt room in --n-ctx.
STREAM_TOKENS = 1000
STALL_BOUND = 0.2  # seconds: the longest gap a writer should see


def fresh_prompt(words: int, rng: random.Random) -> str:
    salt = f"{rng.getrandbits(64):x}"
    return salt + " " + " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Round:
    idle_latency: float = 0.0
    long_latency: float = 0.0
    prompt_tokens: int = 0
    idle_gaps: list[float] = field(default_factory=list)
    busy_gaps: list[float] = field(default_factory=list)


async def complete(http: httpx.AsyncClient, url: str, prompt: str) -> tuple[float, int]:
    started = time.monotonic()
    response = await http.post(url, json={"prompt": prompt, "max_tokens": 1, "seed": 0})
    response.raise_for_status()
    return time.monotonic() - started, response.json()["usage"]["prompt_tokens"]


async def one_round(base_url: str, n: int, words: int, rng: random.Random) -> Round:
    url = f"{base_url}/v1/completions"
    result = Round()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600)) as http:
        result.idle_latency, result.prompt_tokens = await complete(
            http, url, fresh_prompt(words, rng)
        )
        body = {
            "prompt": fresh_prompt(40, rng),
            "n": n,
            "max_tokens": STREAM_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "seed": 1,
        }
        arrivals: list[float] = []
        window: list[float] = []  # when the long request was sent, and when it finished

        async def long_request() -> None:
            window.append(time.monotonic())
            result.long_latency, _ = await complete(http, url, fresh_prompt(words, rng))
            window.append(time.monotonic())

        task: asyncio.Task[None] | None = None
        async with http.stream("POST", url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line.removeprefix("data: "))
                if not any(c["index"] == 0 and c["text"] for c in event["choices"]):
                    continue
                arrivals.append(time.monotonic())
                if task is None and arrivals[-1] - arrivals[0] > 1.0:
                    task = asyncio.create_task(long_request())
                if len(window) == 2 and arrivals[-1] > window[1] + 0.5:
                    break  # hang up: the stream has shown what it does after the prompt
        assert task is not None, "the stream ended before the long request was sent"
        await task
    sent, done = window
    for before, after in itertools.pairwise(arrivals):
        gap = after - before
        if after <= sent:
            result.idle_gaps.append(gap)
        elif before < done:
            result.busy_gaps.append(gap)
    return result


def row(budget: str, rounds: list[Round]) -> str:
    idle = statistics.median(g for r in rounds for g in r.idle_gaps)
    busy = [g for r in rounds for g in r.busy_gaps]
    long = statistics.median(r.long_latency for r in rounds)
    alone = statistics.median(r.idle_latency for r in rounds)
    return (
        f"| {budget} | {rounds[0].prompt_tokens} | {idle * 1000:.0f} ms"
        f" | {statistics.median(busy) * 1000:.0f} ms | **{max(busy) * 1000:.0f} ms**"
        f" | {long:.2f} s | {alone:.2f} s | {long / alone:.2f}×"
        f" | {1 / (1 - idle / STALL_BOUND):.2f}× |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="0,0.15", help="--step-budget values, in order")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-args", default=DEFAULT_SERVER_ARGS)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    words = args.prompt_tokens  # each of WORDS (with its space) is one Gemma token
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for budget in args.budgets.split(","):
            server_args = [*shlex.split(args.server_args), "--step-budget", budget]
            with run_server(Path(tmp), *server_args) as server:
                rounds = [
                    asyncio.run(one_round(server.base_url, args.n, words, rng))
                    for _ in range(args.repeat)
                ]
            lines.append(row(budget, rounds))
    command = " ".join(
        [".venv/bin/python bench/bench_fairness.py", *map(shlex.quote, sys.argv[1:])]
    )
    print(f"server: llama-srb serve {args.server_args} --step-budget <budget>")
    print(
        f"| step budget (s) | prompt tokens | n={args.n} gap, idle median"
        " | gap median, long prompt running | **longest gap** | long request latency"
        " | same, idle server | ratio | least ratio with 0.2 s stalls |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()

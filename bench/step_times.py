"""The longest engine steps of legitimate work: what --stuck-after must stay well above.

    .venv/bin/python bench/step_times.py [--server-args "..."] [--story-tokens 28000]

One fresh server per scenario (so each reads its own `llama_srb_engine_longest_step_seconds`):
  story:       a fresh ~--story-tokens prompt, max_tokens 1: prefilled alone, in full
               512-token chunks, the last ones attending over the whole story;
  n=64:        64 branches of a 2,000-token prompt, 64 tokens each;
  2 x n=64 + story: two n=64 requests decoding (128 rows a step) while a long story is
               prefilled beside them (its chunks sized by --step-budget);
  grammar n=8: a JSON schema, 8 branches (sampling under a grammar, per branch, per step).
Prints a markdown table and the command that reproduces it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_fairness import WORDS
from tests.support.server import RunningServer, run_server

DEFAULT_SERVER_ARGS = "--n-ctx 32768"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "traits": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    },
    "required": ["name", "age", "traits"],
}


def words(count: int, rng: random.Random) -> str:
    return f"{rng.getrandbits(64):x} " + " ".join(rng.choice(WORDS) for _ in range(count))


async def post(
    http: httpx.AsyncClient, server: RunningServer, body: dict[str, object], client: str = "a"
) -> None:
    """As `client` (its X-Session-Id): one client's requests share its sequence cap."""
    headers = {"X-Session-Id": client}
    response = await http.post(f"{server.api_url}/completions", json=body, headers=headers)
    response.raise_for_status()


def story(tokens: int, rng: random.Random) -> Callable[..., Awaitable[None]]:
    async def run(http: httpx.AsyncClient, server: RunningServer) -> None:
        await post(http, server, {"prompt": words(tokens, rng), "max_tokens": 1})

    return run


def wide(rng: random.Random) -> Callable[..., Awaitable[None]]:
    async def run(http: httpx.AsyncClient, server: RunningServer) -> None:
        body = {"prompt": words(2000, rng), "n": 64, "max_tokens": 64, "ignore_eos": True}
        await post(http, server, body)

    return run


def mixed(tokens: int, rng: random.Random) -> Callable[..., Awaitable[None]]:
    async def run(http: httpx.AsyncClient, server: RunningServer) -> None:
        body = {"n": 64, "max_tokens": 96, "ignore_eos": True}
        heavy = [
            asyncio.create_task(post(http, server, {**body, "prompt": words(200, rng)}, c))
            for c in ("heavy-1", "heavy-2")
        ]
        await asyncio.sleep(5)  # both decoding
        await post(http, server, {"prompt": words(tokens // 2, rng), "max_tokens": 1})
        await asyncio.gather(*heavy)

    return run


def grammar(rng: random.Random) -> Callable[..., Awaitable[None]]:
    async def run(http: httpx.AsyncClient, server: RunningServer) -> None:
        body = {
            "prompt": words(500, rng) + "\nA character as JSON:",
            "n": 8,
            "max_tokens": 128,
            "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
        }
        await post(http, server, body)

    return run


async def timed(scenario: Callable[..., Awaitable[None]], server: RunningServer) -> float:
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800)) as http:
        await scenario(http, server)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-args", default=DEFAULT_SERVER_ARGS)
    parser.add_argument("--story-tokens", type=int, default=28_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    scenarios = {
        f"story of {args.story_tokens} tokens, alone": story(args.story_tokens, rng),
        "n=64 × 64 tokens, 2,000-token prompt": wide(rng),
        f"2 × n=64 decoding + a {args.story_tokens // 2}-token story": mixed(
            args.story_tokens, rng
        ),
        "JSON schema, n=8 × 128 tokens": grammar(rng),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, scenario in scenarios.items():
            with run_server(Path(tmp), *shlex.split(args.server_args)) as server:
                wall = asyncio.run(timed(scenario, server))
                longest = server.metric("llama_srb_engine_longest_step_seconds")
                calls = server.metric("llama_srb_decode_steps_total")
                rows.append(f"| {name} | {wall:.1f} s | {calls:.0f} | **{longest:.2f} s** |")
    command = " ".join([".venv/bin/python bench/step_times.py", *map(shlex.quote, sys.argv[1:])])
    print(f"server: llama-srb serve {args.server_args}")
    print("| scenario | wall | steps | longest step |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()

"""Live branching: a fork of a streaming choice against a new request with the same text.

    .venv/bin/python bench/bench_live.py [--model NAME] [--lengths 500 2000 8000]
                                         [--n 8] [--k 4] [--max-tokens 160] [--ctx 20480]
                                         [--forks 5] [--after-chunk]

One fresh server; for each story length (in tokens, sent as token ids):
  1. a parent, n=--n x --max-tokens tokens (ignore_eos), streamed;
  2. once its choice 0 has 40 tokens: --forks forks of it, one after another, k=--k x 8
     tokens each, from the text read when it is sent, at a random moment of a parent step
     (a writer's click is not timed to the engine's steps; --after-chunk: right after a
     chunk of the parent came, so that nearly a whole step is still to run, the worst case);
  3. once the parent ended: the first fork again (its cells now in the prefix cache);
  4. a cold request of the same length (its second token changed: nothing shared), k x 8.
For each: the time to the children's first token (the forks' median, and in the parent's
median steps), and the prompt tokens read (prompt tokens less cached ones, from `usage`).
For the parent: its median gap between chunks, and its longest gap while a fork was read
(from the fork's sending to its first token, plus half a second). The targets are in
docs/api.md, "Live branching".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.server import run_server

PARAGRAPH = (
    "The lighthouse keeper of Varrow Point kept a ledger of every ship that passed, and on "
    "the night of the great storm she wrote the names of seven, then an eighth that had no "
    "name at all, only a lantern burning green above its prow. "
)
FORK_AFTER = 40  # tokens of the parent's choice 0 before the fork


@dataclass
class Answer:
    sent: float = 0.0
    first: float | None = None
    times: list[float] = field(default_factory=list)  # choice 0's chunks: one a step
    texts: dict[int, str] = field(default_factory=dict)  # by choice
    tokens: dict[int, int] = field(default_factory=dict)  # chunks with text, by choice
    usage: dict[str, Any] | None = None
    id: str | None = None

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.sent

    @property
    def read(self) -> int:
        assert self.usage is not None
        cached = (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return int(self.usage["prompt_tokens"]) - int(cached)


async def stream(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], answer: Answer | None = None
) -> Answer:
    """Stream one call into `answer` (the caller may watch it fill)."""
    answer = answer or Answer()
    answer.sent = time.monotonic()
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", url, json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            answer.id = chunk["id"]
            answer.usage = chunk.get("usage") or answer.usage
            texts = [c for c in chunk["choices"] if c.get("text")]
            if texts:
                now = time.monotonic()
                answer.first = answer.first or now
                if any(c["index"] == 0 for c in texts):  # one chunk per choice and step
                    answer.times.append(now)
                for choice in texts:
                    index = choice["index"]
                    answer.texts[index] = answer.texts.get(index, "") + choice["text"]
                    answer.tokens[index] = answer.tokens.get(index, 0) + 1
    return answer


async def story_ids(http: httpx.AsyncClient, base: str, length: int, title: str) -> list[int]:
    """A story of `length` tokens; stories of other titles share no prefix worth forking."""
    text = f"# {title}\n\n" + PARAGRAPH * (length // 30 + 2)
    tokens = (await http.post(f"{base}/tokenize", json={"content": text})).json()["tokens"]
    assert len(tokens) >= length, (len(tokens), length)
    return list(tokens[:length])


async def one_length(base: str, length: int, args: argparse.Namespace) -> dict[str, Any]:
    url = f"{base}/v1/completions"
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600)) as http:
        prompt = await story_ids(http, base, length, f"The story of {length} tokens")
        parent_body = {
            "prompt": prompt,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": 1,
        }
        parent = Answer()
        parent_task = asyncio.create_task(stream(http, url, parent_body, parent))
        rng = random.Random(length)
        forks: list[Answer] = []
        first_body: dict[str, Any] = {}
        for i in range(args.forks):
            while parent.tokens.get(0, 0) < FORK_AFTER + i or len(parent.times) < 3:
                if parent_task.done():
                    raise RuntimeError(f"the parent ended before fork {i + 1}: raise --max-tokens")
                await asyncio.sleep(0.002)
            if args.after_chunk:  # the step that sent the chunk has just ended
                chunks = len(parent.times)
                while len(parent.times) == chunks:
                    await asyncio.sleep(0.001)
            else:  # at a random moment of a step
                await asyncio.sleep(rng.random() * _median_gap(parent))
            # From the text read so far (a token boundary).
            at = len(parent.texts[0])
            fork_body = {"n": args.k, "max_tokens": 8, "ignore_eos": True, "at": at}
            first_body = first_body or fork_body
            forks.append(await stream(http, f"{url}/{parent.id}/choices/0/fork", fork_body))
        if parent_task.done():
            raise RuntimeError("the parent ended during the forks: raise --max-tokens")
        await parent_task
        after = await stream(http, f"{url}/{parent.id}/choices/0/fork", first_body)
        live = forks[0]
        assert live.usage is not None
        size = int(live.usage["prompt_tokens"])
        cold_prompt = await story_ids(http, base, size, f"Another story of {size} tokens")
        cold = await stream(
            http, url, {"prompt": cold_prompt, "n": args.k, "max_tokens": 8, "ignore_eos": True}
        )
    pairs = list(zip(parent.times, parent.times[1:], strict=False))
    during = [
        b - a
        for fork in forks
        for a, b in pairs
        if b >= fork.sent and a <= (fork.first or fork.sent) + 0.5
    ]
    return {
        "length": length,
        "forks": forks,
        "after": after,
        "cold": cold,
        "median_gap": _median_gap(parent),
        "longest_gap": max(during, default=0.0),
    }


def _median_gap(answer: Answer) -> float:
    """The median time between two chunks of choice 0: one decode step."""
    return statistics.median(b - a for a, b in zip(answer.times, answer.times[1:], strict=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[500, 2000, 8000])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--ctx", type=int, default=20480)
    parser.add_argument(
        "--forks", type=int, default=5, help="forks per length while the parent streams"
    )
    parser.add_argument(
        "--after-chunk",
        action="store_true",
        help="send each fork right after a parent chunk (the worst case) instead of at a"
        " random moment",
    )
    args = parser.parse_args()
    if args.max_tokens < FORK_AFTER + args.forks * 24:
        parser.error(f"--max-tokens must be at least {FORK_AFTER + args.forks * 24} for --forks")
    model = ("--model", args.model) if args.model else ()
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), *model, "--n-ctx", str(args.ctx)) as server,
    ):
        for length in args.lengths:
            rows.append(asyncio.run(one_length(server.base_url, length, args)))
    command = " ".join([".venv/bin/python bench/bench_live.py", *map(shlex.quote, sys.argv[1:])])
    print(
        f"parent n={args.n} x {args.max_tokens} streaming; {args.forks} forks k={args.k} x 8"
        " tokens, one after another, each sent"
        f" {'right after a parent chunk' if args.after_chunk else 'at a random moment'};"
        " fork first token: the forks' median, in ms and in parent median steps (each"
        " fork's in brackets, in steps)"
    )
    print(
        "| story tokens | fork while it streams: first token (read) | in parent steps"
        " | same fork after the parent ended | cold request, same length | parent median gap"
        " | parent's longest gap during the forks |\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    for row in rows:
        forks, after, cold, gap = row["forks"], row["after"], row["cold"], row["median_gap"]
        ttft = statistics.median(fork.ttft for fork in forks)
        read = max(fork.read for fork in forks)
        each = ", ".join(f"{fork.ttft / gap:.1f}" for fork in forks)
        print(
            f"| {row['length']:,} | {ttft * 1000:.0f} ms ({read}) | {ttft / gap:.1f} ({each})"
            f" | {after.ttft * 1000:.0f} ms ({after.read}) | {cold.ttft * 1000:.0f} ms"
            f" ({cold.read}) | {gap * 1000:.0f} ms | {row['longest_gap'] * 1000:.0f} ms |"
        )
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()

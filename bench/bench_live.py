"""Live branching: a fork of a streaming choice against a new request with the same text.

    .venv/bin/python bench/bench_live.py [--model NAME] [--lengths 500 2000 8000]
                                         [--n 8] [--k 4] [--max-tokens 160] [--ctx 20480]

One fresh server; for each story length (in tokens, sent as token ids):
  1. a parent, n=--n x --max-tokens tokens (ignore_eos), streamed;
  2. once its choice 0 has 40 tokens: a fork of it, k=--k x 8 tokens, from there;
  3. once the parent ended: the same fork again (its cells now in the prefix cache);
  4. a cold request of the same length (its second token changed: nothing shared), k x 8.
For each: the time to the children's first token, and the prompt tokens read (prompt
tokens less cached ones, from `usage`). For the parent: its median gap between chunks, and
its longest gap while the fork was read (from the fork's sending to its first token, plus
half a second). The targets are in docs/api.md, "Live branching".
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
        while parent.tokens.get(0, 0) < FORK_AFTER:
            if parent_task.done():
                raise RuntimeError("the parent ended before the fork")
            await asyncio.sleep(0.01)
        # From the text read so far (a token boundary): the same point both times.
        fork_body = {"n": args.k, "max_tokens": 8, "ignore_eos": True, "at": len(parent.texts[0])}
        fork_url = f"{url}/{parent.id}/choices/0/fork"
        live = await stream(http, fork_url, fork_body)
        await parent_task
        after = await stream(http, fork_url, fork_body)
        assert live.usage is not None
        size = int(live.usage["prompt_tokens"])
        cold_prompt = await story_ids(http, base, size, f"Another story of {size} tokens")
        cold = await stream(
            http, url, {"prompt": cold_prompt, "n": args.k, "max_tokens": 8, "ignore_eos": True}
        )
    pairs = list(zip(parent.times, parent.times[1:], strict=False))
    window_end = (live.first or live.sent) + 0.5
    during = [b - a for a, b in pairs if b >= live.sent and a <= window_end]
    return {
        "length": length,
        "fork": live,
        "after": after,
        "cold": cold,
        "median_gap": statistics.median(b - a for a, b in pairs),
        "longest_gap": max(during, default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[500, 2000, 8000])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--ctx", type=int, default=20480)
    args = parser.parse_args()
    model = ("--model", args.model) if args.model else ()
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), *model, "--n-ctx", str(args.ctx)) as server,
    ):
        for length in args.lengths:
            rows.append(asyncio.run(one_length(server.base_url, length, args)))
    command = " ".join([".venv/bin/python bench/bench_live.py", *map(shlex.quote, sys.argv[1:])])
    print(f"parent n={args.n} x {args.max_tokens} streaming; fork k={args.k} x 8 tokens")
    print(
        "| story tokens | fork while it streams: first token (read) | same fork after the"
        " parent ended | cold request, same length | parent median gap | parent's longest"
        " gap during the fork |\n|---:|---:|---:|---:|---:|---:|"
    )
    for row in rows:
        fork, after, cold = row["fork"], row["after"], row["cold"]
        print(
            f"| {row['length']:,} | {fork.ttft * 1000:.0f} ms ({fork.read})"
            f" | {after.ttft * 1000:.0f} ms ({after.read}) | {cold.ttft * 1000:.0f} ms"
            f" ({cold.read}) | {row['median_gap'] * 1000:.0f} ms"
            f" | {row['longest_gap'] * 1000:.0f} ms |"
        )
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()

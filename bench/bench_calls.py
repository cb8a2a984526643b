"""A step's decode rows from many requests: one llama_decode call against calls of at most
63 tokens (--tokens-per-call's default on the CPU), side by side in one run; then a
prompt chunk's cost per token on either side of the 64-row tile.

    .venv/bin/python bench/bench_calls.py [--widths 32,64,96,128,160] [--cached 0,4000]
                                          [--chunks 16,32,48,63,64,96,128,512]
                                          [--prefix 4000] [--repeat 4] [--model gemma-3-270m]

Each of width/8 requests has its own 20-token prompt and 8 branches that have decoded 16
tokens together, so, as under load, a branch's cells lie spread over the cache. Then a
step of all `width` rows is timed as one call and as calls of whole requests up to 63
tokens; each cell is the median of --repeat steps. --cached first fills that many cells
with an unrelated story, as the prefix cache would. On the CPU, llama.cpp's flash
attention takes 64 or more rows in tiles of 64, and a tile attends over every cell that
any of its rows may see: rows of many requests make it attend over all their cells.
Below 64 rows it goes row by row instead: cheap over scattered cells, slower per token
over one long prompt. The second table times a prompt chunk of each size appended to a
--prefix-token prompt (and removed again), as beside a stream a long prompt goes in small
chunks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import llama_cpp as C

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.loader import CPU_TOKENS_PER_CALL, model_options, open_context
from llama_srb.native import Batch, Context, Model

BRANCHES, PROMPT, GROWN = 8, 20, 16
CACHED_SEQ = 191  # the unrelated story's sequence id


class Steps:
    def __init__(self, model_name: str) -> None:
        settings = Settings(model=model_name, n_ctx=8192, max_sequences=192)
        self.model = Model(settings.resolved_model_path(), model_options(settings))
        self.ctx: Context = open_context(self.model, settings)
        self.batch = Batch(self.ctx.n_batch)

    def _prefill(self, tokens: list[int], seq: int) -> None:
        for start in range(0, len(tokens), self.ctx.n_batch):
            self.batch.clear()
            chunk = tokens[start : start + self.ctx.n_batch]
            self.batch.add_span(chunk, start, seq, False)
            self.ctx.decode(self.batch)

    def set_up(self, width: int, cached: int) -> None:
        """`width` branches of width/8 requests, grown together; `cached` idle cells."""
        C.llama_memory_clear(self.ctx.memory, True)
        if cached:
            self._prefill([100 + i % 5000 for i in range(cached)], CACHED_SEQ)
        for request in range(width // BRANCHES):
            first = request * BRANCHES
            self._prefill([100 + (request * 31 + i) % 5000 for i in range(PROMPT)], first)
            for seq in range(first + 1, first + BRANCHES):
                self.ctx.seq_cp(first, seq)
        for step in range(GROWN):
            self.step(width, PROMPT + step, width)

    def step(self, width: int, pos: int, per_call: int) -> float:
        """Decode one token for every branch in calls of whole requests up to `per_call`
        tokens; returns the seconds spent in llama_decode."""
        per_call = max(BRANCHES, per_call // BRANCHES * BRANCHES)
        seconds = 0.0
        for first in range(0, width, per_call):
            self.batch.clear()
            for seq in range(first, min(width, first + per_call)):
                self.batch.add(300 + seq, pos, seq, True)
            started = time.perf_counter()
            self.ctx.decode(self.batch)
            seconds += time.perf_counter() - started
        return seconds

    def median_step(self, width: int, cached: int, per_call: int, repeat: int) -> float:
        self.set_up(width, cached)
        return statistics.median(
            self.step(width, PROMPT + GROWN + k, per_call) for k in range(repeat)
        )

    def median_chunk(self, prefix: int, size: int, repeat: int) -> float:
        """Seconds of a `size`-token chunk after a `prefix`-token prompt (already held)."""
        tokens = [100 + (i * 7) % 5000 for i in range(prefix, prefix + size)]
        times = []
        for _ in range(repeat):
            self.batch.clear()
            self.batch.add_span(tokens, prefix, 0, False)
            started = time.perf_counter()
            self.ctx.decode(self.batch)
            times.append(time.perf_counter() - started)
            self.ctx.seq_rm(0, prefix, -1)
        return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="32,64,96,128,160")
    parser.add_argument("--cached", default="0,4000")
    parser.add_argument("--chunks", default="16,32,48,63,64,96,128,512")
    parser.add_argument("--prefix", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--model", default=DEFAULT)
    args = parser.parse_args()
    steps = Steps(args.model)
    print(
        f"| rows | idle cached cells | one call | calls of ≤{CPU_TOKENS_PER_CALL} tokens"
        " | per row, one call | per row, split | split / one |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for cached in map(int, args.cached.split(",")):
        for width in map(int, args.widths.split(",")):
            one = steps.median_step(width, cached, width, args.repeat)
            split = steps.median_step(width, cached, CPU_TOKENS_PER_CALL, args.repeat)
            print(
                f"| {width} | {cached:,} | {one * 1000:.0f} ms | {split * 1000:.0f} ms"
                f" | {one * 1000 / width:.2f} ms | {split * 1000 / width:.2f} ms"
                f" | {split / one:.2f} |",
                flush=True,
            )
    C.llama_memory_clear(steps.ctx.memory, True)
    steps._prefill([100 + (i * 7) % 5000 for i in range(args.prefix)], 0)
    print(f"\n| prompt chunk after {args.prefix:,} tokens | time | per token |")
    print("|---:|---:|---:|")
    for size in map(int, args.chunks.split(",")):
        seconds = steps.median_chunk(args.prefix, size, args.repeat)
        print(f"| {size} | {seconds * 1000:.0f} ms | {seconds * 1000 / size:.2f} ms |", flush=True)
    print(f"\n.venv/bin/python bench/bench_calls.py {' '.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()

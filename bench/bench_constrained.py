"""Constrained requests end to end: the same bodies with and without a constraint, on our
server and on llama.cpp's llama-server, in one run; then the stall table: the longest gap
of a concurrent n=4 stream while each input of the old Known limits runs at n=64.

    .venv/bin/python bench/bench_constrained.py [--ns 1,8,32] [--new-tokens 24]
                                                [--repeat 1] [--llama-tools DIR]
                                                [--skip-llama-server] [--skip-stalls]

1. For each n and each constraint (none, a JSON schema, a regex, a GBNF grammar), one
   /v1/completions request on a fresh ~64-token prompt, max_tokens --new-tokens, seed 1;
   wall seconds to the last byte, and the ratio to the same request unconstrained on the
   same server (issue 28's bound: 1.3 times for the JSON schema at n=8). llama-server gets the
   same bodies (-np the largest n, our context's shape); it has no regex field.
2. Stalls: a streamed n=4 request (128 tokens, ignore_eos) and, once it streams, one of
   tests/integration/test_constrained_bounded.py's inputs at n=64 (a +100 bias on the
   letter into its worst path): the n=4 stream's longest gap between events while both
   run (issue 28's bound: 200 ms), and how the constrained request ended.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_batching import fresh
from bench.bench_vs_llama import load
from bench.llama_tools import TOOLS, Shape, llama_server
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from tests.support.pathological import PATHOLOGICAL
from tests.support.server import run_server

PROMPT = "The keeper wrote down what the storm had left on the shore, one line at a time:"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "story": {"type": "string"}},
    "required": ["name", "story"],
}
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "none": {},
    "JSON schema": {"json_schema": SCHEMA},
    "regex": {"regex": r"[A-Z][a-z]+( [a-z]+){2,40}\."},  # ours only
    "GBNF": {"grammar": 'root ::= "- " [a-zA-Z ,]+ "\\n" ("- " [a-zA-Z ,]+ "\\n")*'},
}
THEIRS_LACK = {"regex"}
TIMEOUT = httpx.Timeout(1800)


def timed(http: httpx.Client, base: str, body: dict[str, Any], repeat: int) -> float:
    """Best wall seconds of `repeat` sends, each on a fresh prompt (no prefix cache)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        response = http.post(f"{base}/v1/completions", json={**body, "prompt": fresh(PROMPT)})
        seconds = time.perf_counter() - started
        response.raise_for_status()
        best = min(best, seconds)
    return best


def side_by_side(
    base: str, ns: list[int], new_tokens: int, repeat: int, skip: set[str]
) -> dict[tuple[int, str], float]:
    with httpx.Client(timeout=TIMEOUT) as http:
        timed(http, base, {"max_tokens": 4}, 1)  # warm-up
        cells = {}
        for n in ns:
            for name, fields in CONSTRAINTS.items():
                if name in skip:
                    continue
                body = {"n": n, "max_tokens": new_tokens, "seed": 1, **fields}
                cells[n, name] = timed(http, base, body, repeat)
                print(f"  n={n} {name}: {cells[n, name]:.2f} s", file=sys.stderr, flush=True)
    return cells


class Events:
    """A streamed request on a thread: when each event came, and how it ended."""

    def __init__(self, base: str, body: dict[str, Any]) -> None:
        self.times: list[float] = []
        self.ending = ""
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base, {**body, "stream": True}))
        self._thread.start()

    def _run(self, base: str, body: dict[str, Any]) -> None:
        reasons: set[str] = set()
        try:
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
                if r.status_code != 200:
                    self.ending = f"{r.status_code}: {json.loads(r.read())['error']['message']}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    self.times.append(time.perf_counter())
                    self.started.set()
                    event = json.loads(line.removeprefix("data: "))
                    if "error" in event:
                        self.ending = f"error event: {event['error']['message']}"
                        return
                    reasons |= {c["finish_reason"] for c in event["choices"] if c["finish_reason"]}
            self.ending = "finished: " + ", ".join(sorted(reasons))
        finally:
            self.started.set()

    def join(self) -> None:
        self._thread.join()

    def longest_gap(self, start: float, end: float) -> float:
        inside = [t for t in self.times if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(inside)), default=0.0)


def stalls(base: str) -> list[tuple[str, float, float, str]]:
    """Per input: the n=4 stream's longest gap while it ran, its seconds, how it ended."""
    rows = []
    for name, (fields, letter, _, max_tokens) in PATHOLOGICAL.items():
        other = Events(
            base, {"prompt": fresh(PROMPT), "n": 4, "max_tokens": 128, "ignore_eos": True}
        )
        other.started.wait()
        started = time.perf_counter()
        heavy = Events(
            base,
            {
                "prompt": "Write it:",
                "n": 64,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "logit_bias": [[letter, 100]],
                **fields,
            },
        )
        heavy.join()
        ended = time.perf_counter()
        other.join()
        rows.append((name, other.longest_gap(started, ended), ended - started, heavy.ending))
        print(f"  {name}: {rows[-1][1] * 1e3:.0f} ms gap", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--model", default=DEFAULT)
    parser.add_argument("--llama-tools", type=Path, default=TOOLS, help="llama.cpp's bin/")
    parser.add_argument("--skip-llama-server", action="store_true")
    parser.add_argument("--skip-stalls", action="store_true")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    started_load = load()

    theirs: dict[tuple[int, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with run_server(Path(tmp), "--model", args.model) as server:
            ours = side_by_side(server.base_url, ns, args.new_tokens, args.repeat, set())
            shape = Shape(n_ctx=int(server.metric("llama_srb_kv_cells_total")))
            rows = [] if args.skip_stalls else stalls(server.base_url)
        if not args.skip_llama_server:
            model_path = Settings(model=args.model).resolved_model_path()
            with llama_server(args.llama_tools, model_path, shape, max(ns), Path(tmp)) as b:
                theirs = side_by_side(b, ns, args.new_tokens, args.repeat, THEIRS_LACK)

    print(
        f"\n{args.model}: {args.new_tokens} tokens at most per branch; wall seconds, best of"
        f" {args.repeat}; × the same request unconstrained on the same server"
    )
    print(f"{started_load} at the start, {load()} at the end\n")
    print("| n | constraint | llama-srb | × none | llama-server | × none |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in ns:
        for name in CONSTRAINTS:
            mine = ours[n, name]
            row = f"| {n} | {name} | {mine:.2f} s | {mine / ours[n, 'none']:.2f}"
            if (n, name) in theirs:
                row += f" | {theirs[n, name]:.2f} s | {theirs[n, name] / theirs[n, 'none']:.2f} |"
            else:
                row += " | – | – |"
            print(row)
    if rows:
        print(
            "\n| input (n=64) beside a streamed n=4 | longest gap of the n=4 stream | ran |"
            " how it ended |"
        )
        print("|---|---:|---:|---|")
        for name, gap, seconds, ending in rows:
            print(f"| {name} | {gap * 1e3:.0f} ms | {seconds:.1f} s | {ending[:120]} |")
    command = [".venv/bin/python bench/bench_constrained.py", *map(shlex.quote, sys.argv[1:])]
    print(f"\nreproduce: {' '.join(command)}")


if __name__ == "__main__":
    main()

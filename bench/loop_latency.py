"""Does heavy request preparation stall the event loop? /health latency while it runs.

    .venv/bin/python bench/loop_latency.py [--probes 200]

For each heavy request (a 7 MB /tokenize, a 262k-entry logit_bias with n=8, the largest
accepted grammar with n=64), one thread sends it while another probes GET /health every
10 ms; the table shows the probes' median, p99 and worst latency, and how long the heavy
request took. Idle: the same probes with nothing else running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.sampling.grammar import MAX_GRAMMAR_CHARS
from tests.support.server import RunningServer, run_server


def heavy_requests(server: RunningServer) -> dict[str, Callable[[], int]]:
    def post(path: str, body: object) -> int:
        return httpx.post(f"{server.base_url}{path}", json=body, timeout=600).status_code

    rules = MAX_GRAMMAR_CHARS // 40
    grammar = "root ::= r0\n" + "".join(f'r{i} ::= "w{i}" | r{i + 1}\n' for i in range(rules))
    grammar += f'r{rules} ::= "end"\n'
    return {
        "7 MB /tokenize": lambda: post(
            "/tokenize", {"content": "The keeper rowed. " * 390_000, "parse_special": False}
        ),
        "262k logit_bias, n=8": lambda: post(
            "/v1/completions",
            {
                "prompt": "Hi",
                "n": 8,
                "max_tokens": 1,
                "logit_bias": {str(t): -1 for t in range(262_144)},
            },
        ),
        f"{len(grammar) // 1024} KiB grammar, n=64": lambda: post(
            "/v1/completions", {"prompt": "Hi", "n": 64, "max_tokens": 1, "grammar": grammar}
        ),
    }


def probe(server: RunningServer, until: threading.Event, most: int) -> list[float]:
    latencies: list[float] = []
    with httpx.Client(timeout=30) as client:
        while not until.is_set() and len(latencies) < most:
            started = time.perf_counter()
            client.get(f"{server.base_url}/health").raise_for_status()
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    return latencies


def row(name: str, latencies: list[float], heavy: str) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"| {name} | {len(ordered)} | {statistics.median(ordered) * 1000:.1f} ms"
        f" | {p99 * 1000:.1f} ms | {ordered[-1] * 1000:.1f} ms | {heavy} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    args = parser.parse_args()
    print(f"command: .venv/bin/python bench/loop_latency.py --probes {args.probes}\n")
    print("| while | probes | median | p99 | worst | heavy request |")
    print("|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(tmp), "--n-ctx", "4096") as server:
        print(row("idle", probe(server, threading.Event(), args.probes), "—"), flush=True)
        for name, send in heavy_requests(server).items():
            print(row(name, *while_running(server, send)), flush=True)


def while_running(server: RunningServer, send: Callable[[], int]) -> tuple[list[float], str]:
    """/health latencies while `send` runs on another thread, and how `send` ended."""
    done = threading.Event()
    outcome: list[str] = []

    def run() -> None:
        started = time.perf_counter()
        status = send()
        outcome.append(f"{status} in {time.perf_counter() - started:.2f} s")
        done.set()

    worker = threading.Thread(target=run)
    worker.start()
    latencies = probe(server, done, 10_000)
    worker.join()
    return latencies, outcome[0]


if __name__ == "__main__":
    main()

"""Memory after a big request: the server's RSS before, during and after requests of many
branches, and once it has been idle a moment.

    .venv/bin/python bench/memory.py [--n 64] [--max-tokens 64] [--repeat 3]
                                     [--server-args "..."]

Starts the server itself (tests.support.server.run_server), warms it with a one-token
request, then sends --repeat requests of n=--n x --max-tokens (ignore_eos), one after
another, sampling /proc/<pid>/status every 0.2 s. To compare with another checkout, run
this script with PYTHONPATH pointing at it: the server is started from the same Python
path.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.soak import rss_mib
from tests.support.server import RunningServer, run_server

IDLE_S = 3.0


def complete(server: RunningServer, body: dict[str, object]) -> None:
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=3600)
    response.raise_for_status()


def peak_during(server: RunningServer, body: dict[str, object]) -> float:
    """The highest RSS sampled while the request ran."""
    peak = [rss_mib(server.process.pid)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], rss_mib(server.process.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        complete(server, body)
    finally:
        done.set()
        sampler.join()
    return peak[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server-args", default="--n-ctx 40960")
    args = parser.parse_args()
    body = {
        "prompt": "The lighthouse keeper climbed the stairs. At the top,",
        "n": args.n,
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
    }
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), *shlex.split(args.server_args)) as server,
    ):
        complete(server, {"prompt": "Hi", "max_tokens": 1})
        time.sleep(IDLE_S)
        base = rss_mib(server.process.pid)
        for i in range(args.repeat):
            peak = peak_during(server, body)
            after = rss_mib(server.process.pid)
            time.sleep(IDLE_S)
            idle = rss_mib(server.process.pid)
            rows.append(
                f"| {i + 1} | {base:.0f} | {peak:.0f} | {after:.0f} | **{idle:.0f}**"
                f" | {idle - base:+.0f} |"
            )
    command = " ".join([".venv/bin/python bench/memory.py", *map(shlex.quote, sys.argv[1:])])
    print(f"server: llama-srb serve {args.server_args}; requests n={args.n} x {args.max_tokens}")
    print(
        "| request | RSS before (MiB) | peak | at its end | "
        f"**{IDLE_S:g} s idle after** | change from before the first |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()

"""Soak: 16 writers send mixed traffic for a while; nothing may be lost, memory must stay
bounded, and the server must be idle at the end.

    .venv/bin/python bench/soak.py [--duration 600] [--max-tokens 48] [--cancel 0.15]
                                   [--heavy-n 32] [--seed 0] [--server-args "..."]

Starts the server itself (tests.support.server.run_server). Writer 0 is heavy: requests of
--heavy-n branches. The 15 others send what bench/load.py sends (streaming or not, n 1-8,
a fraction cancelled midway, 429s retried after Retry-After), one request after another,
each with its own X-Session-Id, so that fair share tells them apart. The server's RSS is
sampled every --sample seconds. Prints the outcome of every request, latencies per kind of
writer, RSS over time (first, peak, last, last after idle), and what was left running.
"Lost" is any request that got neither a complete answer nor an explicit error; it must
be 0. Exits non-zero when a request was lost or failed, or the server was left busy.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import PROMPTS, Client, Plan, Result, _percentiles, idle_gauges
from tests.support.server import run_server

WRITERS = 16
DEFAULT_SERVER_ARGS = "--n-ctx 16384 --max-queue 64"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Sampler(threading.Thread):
    """The server's RSS every `period` seconds, until stopped."""

    def __init__(self, pid: int, period: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MiB)
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            self.samples.append((time.monotonic() - started, rss_mib(self.pid)))
            self.stop.wait(self.period)


def plan_for(writer: int, k: int, args: argparse.Namespace, rng: random.Random) -> Plan:
    """Writer `writer`'s k-th request; its index keeps the writer's session (index % 16)."""
    heavy = writer == 0
    cancelled = rng.random() < args.cancel
    stream = rng.random() < 0.5
    return Plan(
        index=writer + WRITERS * k,
        prompt=f"{rng.choice(PROMPTS)} ({writer}.{k})",
        n=args.heavy_n if heavy else rng.randint(1, 8),
        max_tokens=args.max_tokens * (3 if heavy else 1),
        stream=stream,
        cancel_after=(0.0 if stream else rng.uniform(0.1, 1.0)) if cancelled else None,
    )


async def soak(base_url: str, args: argparse.Namespace) -> dict[int, list[Result]]:
    results: dict[int, list[Result]] = {w: [] for w in range(WRITERS)}
    limits = httpx.Limits(max_connections=WRITERS * 2, max_keepalive_connections=WRITERS)
    deadline = time.monotonic() + args.duration
    async with httpx.AsyncClient(timeout=httpx.Timeout(900), limits=limits) as http:
        client = Client(http, base_url)

        async def writer(w: int) -> None:
            rng = random.Random(args.seed * 1000 + w)
            k = 0
            while time.monotonic() < deadline:
                results[w].append(await client.run(plan_for(w, k, args, rng)))
                k += 1

        await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of traffic")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--cancel", type=float, default=0.15)
    parser.add_argument("--heavy-n", type=int, default=32)
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-args", default=DEFAULT_SERVER_ARGS)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), *shlex.split(args.server_args)) as server,
    ):
        sampler = Sampler(server.process.pid, args.sample)
        sampler.start()
        started = time.monotonic()
        results = asyncio.run(soak(server.base_url, args))
        wall = time.monotonic() - started
        left = {k: v for k, v in idle_gauges(server).items() if v}
        time.sleep(args.sample)  # idle: what memory comes back
        idle_rss = rss_mib(server.process.pid)
        sampler.stop.set()
    everything = [r for rs in results.values() for r in rs]
    outcomes = Counter(r.outcome for r in everything)
    command = " ".join([".venv/bin/python bench/soak.py", *map(shlex.quote, sys.argv[1:])])
    print(f"server: llama-srb serve {args.server_args}")
    print(f"wall {wall:.0f} s, {len(everything)} requests from {WRITERS} writers")
    print("| outcome | " + " | ".join(("ok", "cancelled", "error", "rejected", "lost")) + " |")
    print("|---|---:|---:|---:|---:|---:|")
    counts = (outcomes.get(name, 0) for name in ("ok", "cancelled", "error", "rejected", "lost"))
    print("| requests | " + " | ".join(map(str, counts)) + " |")
    print(f"429 answers (retried): {sum(r.retries_429 for r in everything)}")
    for label, writers in (("heavy writer", [0]), ("15 other writers", range(1, WRITERS))):
        ok = [r for w in writers for r in results[w] if r.outcome == "ok"]
        ttft = _percentiles([r.ttft for r in ok if r.ttft is not None])
        latency = _percentiles([r.latency for r in ok if r.latency is not None])
        print(f"{label}: {len(ok)} completed; TTFT {ttft}; latency {latency}")
    rss = [mib for _, mib in sampler.samples]
    print(
        f"RSS MiB: first {rss[0]:.0f}, peak {max(rss):.0f}, last under load {rss[-1]:.0f},"
        f" idle after {idle_rss:.0f} ({len(rss)} samples every {args.sample:g} s)"
    )
    print("RSS over time: " + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in sampler.samples[::6]))
    print(f"left running: {left}")
    for r in everything:
        if r.outcome in ("error", "lost"):
            print(f"  {r.outcome}: {r.detail[:200]}")
    print(f"reproduce: {command}")
    if outcomes.get("error") or outcomes.get("lost") or left:
        sys.exit(1)


if __name__ == "__main__":
    main()

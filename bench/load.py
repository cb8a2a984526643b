"""Load: many clients at once, some hanging up midway; nothing may be lost.

    .venv/bin/python bench/load.py [--requests 200] [--concurrency 32] [--max-tokens 24]
                                   [--cancel 0.15] [--seed 0] [--server-args "..."]
                                   [--replicas 1]

--server-args may be given several times: each setting gets the same requests in turn, in
one run, and a table compares them at the end.

Starts the server itself on loopback (tests.support.server.run_server; with --replicas N,
N servers behind deploy/nginx.conf), sends --requests requests from --concurrency workers
as 16 writers (streaming and not, n from 1 to 8, a fraction cancelled midway) and prints
throughput, p50/p95 time to first token and total latency, and the outcome of every
request. A 429 (queue full) is retried after its Retry-After and counted apart; time to
first token and latency count from the first try. "Lost" is any request that got neither
a complete answer nor an explicit error (a dropped connection, a stream without `[DONE]`,
a missing choice): it must be 0.
Exits non-zero when a request was lost or failed, or when the server is left busy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import run_balancer
from tests.support.server import RunningServer, run_server

PROMPTS = (
    "The lighthouse keeper found a letter on the rocks. It said:",
    "Write the opening line of a mystery novel set in a small fishing village:",
    "The dragon had not left its cave in a hundred years, until the morning",
    "Dear diary, today the strangest thing happened at the bakery.",
)
DEFAULT_SERVER_ARGS = "--n-ctx 8192 --max-queue 16"
MAX_RETRIES = 60  # 429s in a row before a request is counted as rejected


@dataclass(frozen=True)
class Plan:
    index: int
    prompt: str
    n: int
    max_tokens: int
    stream: bool
    cancel_after: float | None  # seconds (non-streaming) or after the first text (streaming)

    @property
    def headers(self) -> dict[str, str]:
        # 16 writers: behind a balancer, each writer's requests stay on one replica.
        return {"X-Session-Id": f"writer-{self.index % 16}"}


@dataclass
class Result:
    outcome: str  # ok | cancelled | error | rejected | lost
    detail: str = ""
    ttft: float | None = None
    latency: float | None = None
    tokens: int = 0
    retries_429: int = 0
    retry_after: float = 1.0  # from a 429


class ServerAccount(NamedTuple):
    """Where a server says its time went."""

    mean_wait: float  # seconds from arrival to admission, per request
    short: dict[str, int]  # steps the queue's head lacked "sequences" or "cells"
    steps: int
    decode_seconds: float  # spent in llama_decode
    tokens_decoded: int  # prompt tokens evaluated + tokens generated


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0
    left_running: dict[str, float] = field(default_factory=dict)  # gauges once settled
    accounts: list[ServerAccount] = field(default_factory=list)  # one per server

    @property
    def failed(self) -> bool:
        return any(r.outcome in ("error", "lost") for r in self.results)

    @property
    def wait_summary(self) -> str:
        return "; ".join(
            f"{a.mean_wait:.1f} s; {a.short['sequences']} / {a.short['cells']} of {a.steps}"
            f"; {a.decode_seconds / self.wall:.0%}"
            f"; {1000 * a.decode_seconds / max(a.tokens_decoded, 1):.2f} ms"
            for a in self.accounts
        )

    def print(self, plans: list[Plan]) -> None:
        outcomes = Counter(r.outcome for r in self.results)
        ok = [r for r in self.results if r.outcome == "ok"]
        tokens = sum(r.tokens for r in self.results)
        streaming = sum(p.stream for p in plans)
        print(
            f"requests      {len(plans)} ({streaming} streaming), n 1-8, "
            f"{sum(p.cancel_after is not None for p in plans)} planned cancellations"
        )
        print(f"wall time     {self.wall:.1f} s")
        print(
            f"throughput    {len(ok) / self.wall:.2f} completed requests/s, "
            f"{tokens / self.wall:.0f} generated tokens/s"
        )
        print(
            f"TTFT          {_percentiles([r.ttft for r in ok if r.ttft is not None])}"
            "  (streaming, to the first text)"
        )
        print(
            f"latency       {_percentiles([r.latency for r in ok if r.latency is not None])}"
            "  (completed requests, total)"
        )
        for name in ("ok", "cancelled", "error", "rejected", "lost"):
            print(f"{name:<13} {outcomes.get(name, 0)}")
        print(
            f"429 answers   {sum(r.retries_429 for r in self.results)} (each retried after "
            "Retry-After)"
        )
        print(f"left running  {self.left_running}")
        for r in self.results:
            if r.outcome in ("error", "lost"):
                print(f"  {r.outcome}: {r.detail[:200]}")
        print(f"server side   admission wait, queue's head short: {self.wait_summary}")

    def row(self, setting: str) -> str:
        """One line of the comparison table (markdown)."""
        ok = [r for r in self.results if r.outcome == "ok"]
        ttft = _p50_p95([r.ttft for r in ok if r.ttft is not None])
        latency = _p50_p95([r.latency for r in ok if r.latency is not None])
        lost = sum(r.outcome in ("error", "lost") for r in self.results)
        return (
            f"| `{setting}` | {self.wall:.1f} s | {ttft[0]:.1f} / {ttft[1]:.1f} s"
            f" | {latency[0]:.1f} / {latency[1]:.1f} s | {lost} | {self.wait_summary} |"
        )


def _p50_p95(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return float("nan"), float("nan")
    return statistics.median(values), statistics.quantiles(values, n=20)[18]


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    p50, p95 = _p50_p95(values)
    return f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms"


def make_plans(count: int, max_tokens: int, cancel: float, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for i in range(count):
        stream = rng.random() < 0.5
        cancelled = rng.random() < cancel
        plans.append(
            Plan(
                index=i,
                prompt=f"{rng.choice(PROMPTS)} ({i})",
                n=rng.randint(1, 8),
                max_tokens=rng.randint(max(1, max_tokens // 2), max_tokens),
                stream=stream,
                cancel_after=(0.0 if stream else rng.uniform(0.1, 1.0)) if cancelled else None,
            )
        )
    return plans


class Client:
    def __init__(self, http: httpx.AsyncClient, base_url: str) -> None:
        self.http = http
        self.url = f"{base_url}/v1/completions"

    async def run(self, plan: Plan) -> Result:
        body = {
            "prompt": plan.prompt,
            "n": plan.n,
            "max_tokens": plan.max_tokens,
            "seed": plan.index,
            "stream": plan.stream,
            "stream_options": {"include_usage": True} if plan.stream else None,
        }
        retries = 0
        started = time.monotonic()  # the first try: waits behind 429s count, as a user feels them
        while True:
            try:
                result = await (
                    self._stream(plan, body, started)
                    if plan.stream
                    else self._complete(plan, body, started)
                )
            except (httpx.HTTPError, json.JSONDecodeError) as exc:
                result = Result("lost", f"#{plan.index}: {type(exc).__name__}: {exc}")
            if result.outcome != "rejected" or retries >= MAX_RETRIES:
                result.retries_429 = retries + (result.outcome == "rejected")
                return result
            retries += 1
            await asyncio.sleep(result.retry_after)

    async def _complete(self, plan: Plan, body: dict[str, object], started: float) -> Result:
        try:
            response = await asyncio.wait_for(
                self.http.post(self.url, json=body, headers=plan.headers), plan.cancel_after
            )
        except TimeoutError:  # hung up on purpose: the connection closes, the server aborts
            return Result("cancelled")
        if response.status_code == 429:
            return Result("rejected", retry_after=float(response.headers.get("retry-after", 1)))
        if response.status_code != 200:
            return Result("error", f"#{plan.index}: {response.status_code} {response.text}")
        out = response.json()
        reasons = [c.get("finish_reason") for c in out["choices"]]
        if len(reasons) != plan.n or not all(r in ("stop", "length") for r in reasons):
            return Result("lost", f"#{plan.index}: incomplete choices {reasons}")
        latency = time.monotonic() - started
        return Result("ok", latency=latency, tokens=out["usage"]["completion_tokens"])

    async def _stream(self, plan: Plan, body: dict[str, object], started: float) -> Result:
        ttft: float | None = None
        finished: set[int] = set()
        tokens = 0
        async with self.http.stream("POST", self.url, json=body, headers=plan.headers) as response:
            if response.status_code == 429:
                return Result("rejected", retry_after=float(response.headers.get("retry-after", 1)))
            if response.status_code != 200:
                await response.aread()
                return Result("error", f"#{plan.index}: {response.status_code} {response.text}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    if len(finished) != plan.n:
                        return Result("lost", f"#{plan.index}: [DONE] with {finished} finished")
                    latency = time.monotonic() - started
                    return Result("ok", ttft=ttft, latency=latency, tokens=tokens)
                event = json.loads(data)
                if "error" in event:
                    return Result("error", f"#{plan.index}: {event['error']}")
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                for choice in event["choices"]:
                    if choice["text"] and ttft is None:
                        ttft = time.monotonic() - started
                        if plan.cancel_after is not None:  # hang up mid-stream
                            return Result("cancelled")
                    if choice["finish_reason"]:
                        finished.add(choice["index"])
        return Result("lost", f"#{plan.index}: the stream ended without [DONE]")


async def drive(base_url: str, plans: list[Plan], concurrency: int) -> Report:
    queue: asyncio.Queue[Plan] = asyncio.Queue()
    for plan in plans:
        queue.put_nowait(plan)
    report = Report()
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300), limits=limits) as http:
        client = Client(http, base_url)

        async def worker() -> None:
            while not queue.empty():
                report.results.append(await client.run(queue.get_nowait()))

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        report.wall = time.monotonic() - started
    return report


def idle_gauges(server: RunningServer) -> dict[str, float]:
    """Running and waiting gauges once the server settles (a second at most)."""
    names = (
        "llama_srb_requests_running",
        "llama_srb_requests_waiting",
        "llama_srb_sequences_running",
    )
    deadline = time.monotonic() + 1.0
    while True:
        sample = server.metrics()
        gauges = {name.removeprefix("llama_srb_"): sample[name] for name in names}
        if not any(gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.05)


def where_requests_waited(server: RunningServer) -> ServerAccount:
    """The server's own account, from /metrics."""
    sample = server.metrics()
    prefix = "llama_srb_queue_wait_seconds"
    count = sample.get(f"{prefix}_count", 0.0)
    mean = sample.get(f"{prefix}_sum", 0.0) / max(count, 1)
    short = {
        lacking: int(sample.get(f'llama_srb_admission_short_steps_total{{lacking="{lacking}"}}', 0))
        for lacking in ("sequences", "cells")
    }
    steps = int(sample.get("llama_srb_decode_steps_total", 0))
    decoding = sample.get("llama_srb_decode_seconds_total", 0.0)
    tokens = sample.get("llama_srb_prompt_tokens_evaluated_total", 0.0) + sample.get(
        "llama_srb_generated_tokens_total", 0.0
    )
    return ServerAccount(mean, short, steps, decoding, int(tokens))


def run_setting(args: argparse.Namespace, server_args: str, plans: list[Plan]) -> Report:
    """Serve with `server_args`, drive the plans, print the report; returns it."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(run_server(Path(tmp), *shlex.split(server_args)))
            for _ in range(args.replicas)
        ]
        url = servers[0].base_url
        if args.replicas > 1:
            hosts = [s.base_url.removeprefix("http://") for s in servers]
            url = stack.enter_context(run_balancer(Path(tmp), hosts)).base_url
            print(f"balancer      nginx (deploy/nginx.conf) in front of {args.replicas} replicas")
        print(f"server        llama-srb serve {server_args}")
        report = asyncio.run(drive(url, plans, args.concurrency))
        report.left_running = {k: v for s in servers for k, v in idle_gauges(s).items() if v}
        report.accounts = [where_requests_waited(s) for s in servers]
    report.print(plans)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--cancel", type=float, default=0.15, help="fraction hung up midway")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--server-args", action="append", help=f"(repeatable) default: {DEFAULT_SERVER_ARGS!r}"
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="servers behind deploy/nginx.conf (1: no nginx)"
    )
    args = parser.parse_args()

    plans = make_plans(args.requests, args.max_tokens, args.cancel, args.seed)
    command = " ".join([".venv/bin/python bench/load.py", *map(shlex.quote, sys.argv[1:])])
    settings = args.server_args or [DEFAULT_SERVER_ARGS]
    reports = [run_setting(args, setting, plans) for setting in settings]
    print()
    print(
        "| server | wall | TTFT p50 / p95 | latency p50 / p95 | lost or failed"
        " | admission wait (mean); steps the queue's head lacked sequences / cells;"
        " share of wall in llama_decode; its time per token (prompt + generated) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for setting, report in zip(settings, reports, strict=True):
        print(report.row(setting))
    print(f"\n{command}")
    bad = any(r.failed or r.left_running for r in reports)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

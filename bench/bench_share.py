"""Fair share: a light client's first token while heavy clients hold the server, ours
beside llama.cpp's llama-server on the same traffic.

    .venv/bin/python bench/bench_share.py [--n 64] [--max-tokens 511] [--heavy-clients 2]
                                          [--light-timeout 120] [--ctx 81920]
                                          [--llama-server PATH] [--only ours|theirs]

Each setting gets a fresh server and the same traffic, all of it streamed:
  1. heavy client(s): two requests of n=--n x --max-tokens tokens (ignore_eos) from
     --heavy-clients distinct clients (X-Session-Id), the second sent once the first
     streams;
  2. once both are admitted (streaming) or 5 s after the second was sent, the light
     client: one request, n=1, a 4-token prompt, 16 tokens.
The table gives each request's time to first token (from its own sending) and the light
request's total time; a light request that waited more than --light-timeout is cut and
shown as "> N s". Then the heavy ones are hung up. The bound for ours is in
docs/fairness.md. llama-server is the one `make llama-tools` builds from the same
llama.cpp sources (one slot per sequence, a unified KV cache of the same size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import bundled_model_path
from tests.support.processes import healthy, running
from tests.support.server import free_port, run_server

LLAMA_SERVER = Path.home() / ".cache/llama-srb/llama-tools-0.3.36/bin/llama-server"
HEAVY_PROMPT = "The lighthouse keeper climbed the stairs. At the top,"
LIGHT_PROMPT = "Once upon a"  # 4 tokens with Gemma's BOS


@dataclass
class Timing:
    sent: float = 0.0
    first: float | None = None  # first text
    ended: float | None = None
    cut: float | None = None  # hung up (or given up) at

    def ttft(self) -> str:
        if self.first is not None:
            return f"{self.first - self.sent:.1f} s"
        return f"> {(self.cut or self.sent) - self.sent:.0f} s"

    def total(self) -> str:
        if self.ended is not None:
            return f"{self.ended - self.sent:.1f} s"
        return f"> {(self.cut or self.sent) - self.sent:.0f} s"


async def stream(
    http: httpx.AsyncClient,
    url: str,
    body: dict[str, object],
    client: str,
    timing: Timing,
    stop: asyncio.Event,
) -> None:
    """Stream one completion, noting its first text, until it ends or `stop` is set."""
    timing.sent = time.monotonic()
    headers = {"X-Session-Id": client}
    async with http.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if stop.is_set():
                return
            if not line.startswith("data: {"):
                continue
            event = json.loads(line.removeprefix("data: "))
            if timing.first is None and any(c.get("text") for c in event.get("choices", [])):
                timing.first = time.monotonic()
    timing.ended = time.monotonic()


async def traffic(base_url: str, args: argparse.Namespace) -> tuple[Timing, Timing, Timing]:
    url = f"{base_url}/v1/completions"
    heavy_body = {
        "prompt": HEAVY_PROMPT,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "temperature": 1.0,
    }
    light_body = {"prompt": LIGHT_PROMPT, "max_tokens": 16, "ignore_eos": True}
    heavy = [Timing(), Timing()]
    light = Timing()
    stop = asyncio.Event()
    clients = ["heavy-1", "heavy-2" if args.heavy_clients == 2 else "heavy-1"]
    timeout = httpx.Timeout(3600)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=8)) as http:
        tasks = [asyncio.create_task(stream(http, url, heavy_body, clients[0], heavy[0], stop))]
        while heavy[0].first is None:
            await asyncio.sleep(0.05)
        tasks.append(asyncio.create_task(stream(http, url, heavy_body, clients[1], heavy[1], stop)))
        deadline = time.monotonic() + 5
        while heavy[1].first is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                stream(http, url, light_body, "light", light, asyncio.Event()), args.light_timeout
            )
        stop.set()  # hang up the heavy ones
        for timing in (*heavy, light):
            timing.cut = time.monotonic()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return heavy[0], heavy[1], light


@contextlib.contextmanager
def llama_server(tmp: Path, binary: Path, slots: int, ctx: int) -> Iterator[str]:
    port = free_port()
    cmd = [
        str(binary),
        *("-m", str(bundled_model_path())),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("-c", str(ctx), "-np", str(slots), "--kv-unified"),
        *("-t", str(os.cpu_count() or 1), "-b", "512", "-ub", "512"),
    ]
    base = f"http://127.0.0.1:{port}"

    with running(cmd, tmp / f"llama-server-{port}.log", healthy(base), timeout=120):
        yield base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=511)
    parser.add_argument("--heavy-clients", type=int, choices=(1, 2), default=2)
    parser.add_argument("--light-timeout", type=float, default=120)
    parser.add_argument("--ctx", type=int, default=81920)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--only", choices=("ours", "theirs"))
    args = parser.parse_args()
    ours = {
        "llama-srb (defaults: fair share, reserve of 8)": [],
        "llama-srb, no reserve, no per-client cap": [
            *("--reserve-sequences", "0", "--client-max-sequences", "128"),
        ],
    }
    theirs = {"llama-server -np 128": 128, "llama-server -np 136": 136}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "theirs":
            for name, extra in ours.items():
                server_args = ("--n-ctx", str(args.ctx), "--max-n", str(args.n), *extra)
                with run_server(Path(tmp), *server_args) as server:
                    rows.append((name, asyncio.run(traffic(server.base_url, args))))
        if args.only != "ours":
            for name, slots in theirs.items():
                with llama_server(Path(tmp), args.llama_server, slots, args.ctx) as base:
                    rows.append((name, asyncio.run(traffic(base, args))))
    command = " ".join([".venv/bin/python bench/bench_share.py", *map(shlex.quote, sys.argv[1:])])
    heavies = "two heavy clients" if args.heavy_clients == 2 else "one heavy client, twice"
    print(f"traffic: {heavies}, n={args.n} x {args.max_tokens} tokens each; then one light")
    print(f"request (n=1, 4-token prompt, 16 tokens); KV cache {args.ctx} cells")
    print(
        "| server | heavy 1 TTFT | heavy 2 TTFT | **light TTFT** | light total |\n"
        "|---|---:|---:|---:|---:|"
    )
    for name, (first, second, light) in rows:
        print(
            f"| {name} | {first.ttft()} | {second.ttft()} | **{light.ttft()}** | {light.total()} |"
        )
    print(f"reproduce: {command}")


if __name__ == "__main__":
    main()

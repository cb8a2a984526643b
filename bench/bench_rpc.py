"""What llama.cpp's RPC backend costs over loopback: the default model local, and split over
one and two rpc-server workers on this machine (`--rpc`, `--n-gpu-layers 99`), side by side.

    make rpc-worker  # builds llama.cpp's rpc-server once (Ctrl+C once it serves)
    LLAMA_SRB_RPC_SERVER=~/.cache/llama-srb/rpc-server-0.3.36/bin/ggml-rpc-server \\
        .venv/bin/python bench/bench_rpc.py [--new-tokens 64] [--prompt-words 400]

Prints, for each setup, prefill tokens/s of a fresh prompt and decode tokens/s at n=1 and
n=8 (ignore_eos), best of 2. Loopback shows the protocol's cost, not a network's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import RPC_SERVER, run_rpc_worker
from tests.support.server import RunningServer, run_server

ARGS = ("--n-ctx", "4096", "--max-n", "8", "--max-sequences", "8")
WORDS = [
    "the",
    "keeper",
    "climbed",
    "the",
    "stairs",
    "and",
    "trimmed",
    "the",
    "wick",
    "before",
    "the",
    "storm",
    "came",
    "in",
]


def prompt(words: int, salt: int) -> str:
    return f"Chapter {salt}. " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


def timed(server: RunningServer, body: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=600)
    response.raise_for_status()
    return time.perf_counter() - started, response.json()


def measure(server: RunningServer, new_tokens: int, words: int) -> list[float]:
    """prefill tokens/s, then decode tokens/s at n=1 and n=8 (best of 2 each)."""
    prefill = []
    for salt in range(2):  # a fresh prompt each time: nothing from the cache
        seconds, out = timed(server, {"prompt": prompt(words, salt), "max_tokens": 1})
        prefill.append(out["usage"]["prompt_tokens"] / seconds)
    rates = [max(prefill)]
    for n in (1, 8):
        best = 0.0
        for salt in range(2):
            body = {
                "prompt": prompt(16, 100 + salt),
                "n": n,
                "max_tokens": new_tokens,
                "ignore_eos": True,
            }
            seconds, out = timed(server, body)
            best = max(best, out["usage"]["completion_tokens"] / seconds)
        rates.append(best)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=400)
    args = parser.parse_args()
    if not Path(RPC_SERVER).is_file():
        sys.exit("set LLAMA_SRB_RPC_SERVER to llama.cpp's rpc-server (`make rpc-worker` builds it)")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (0, 1, 2):
            with ExitStack() as stack:
                endpoints = [
                    stack.enter_context(run_rpc_worker(Path(tmp)))[0] for _ in range(workers)
                ]
                extra = ("--rpc", ",".join(endpoints), "--n-gpu-layers", "99") if workers else ()
                server = stack.enter_context(run_server(Path(tmp), *ARGS, *extra))
                label = f"{workers} rpc-server worker{'s' if workers > 1 else ''}"
                rows.append(
                    (
                        label if workers else "local",
                        measure(server, args.new_tokens, args.prompt_words),
                    )
                )
            print(f"  {rows[-1][0]} done", file=sys.stderr, flush=True)

    local = rows[0][1]
    print(f"\nRPC over loopback: {args.prompt_words}-word prompt, {args.new_tokens} new tokens")
    print(
        "\n| setup | prefill tok/s | vs local | n=1 decode tok/s | vs local | n=8 tok/s | vs local |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, rates in rows:
        cells = " | ".join(
            f"{r:.0f} | {r / base:.2f}" for r, base in zip(rates, local, strict=True)
        )
        print(f"| {label} | {cells} |")
    print(f"\nReproduce: {' '.join(['.venv/bin/python', *sys.argv])}")


if __name__ == "__main__":
    main()

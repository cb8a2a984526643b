"""Single request batching, measured: one request with n vs n concurrent vs n sequential,
and the engine's limit (a raw llama.cpp loop), side by side in one run.

    .venv/bin/python bench/bench_batching.py [--ns 1,2,4,8,16] [--prompt-tokens 512]
                                             [--new-tokens 128] [--repeat 1]
                                             [--model gemma-3-270m]

Every generation uses `ignore_eos`, so each branch produces exactly --new-tokens tokens.
Times are wall seconds from sending to the last byte (prefill included); tok/s counts
generated tokens of all branches. With --repeat R each cell is the best of R runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.raw_loop import RawLoop
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.native import Model
from tests.support.server import RunningServer, run_server

PARAGRAPH = (
    "The lighthouse stood at the edge of the world, and every night its keeper climbed the "
    "hundred and twelve steps to light the lamp. The sea below was never quiet; it argued "
    "with the rocks, it whispered to the gulls, and sometimes, in the hour before dawn, it "
    "sang. Mara had kept the light for thirty years, since the winter her father's boat "
    "failed to return. "
)


def make_prompt(model: Model, n_tokens: int) -> str:
    """Story text that, under a fresh tag, is about `n_tokens` tokens long."""
    text = PARAGRAPH
    while len(model.tokenize(fresh(text))) < n_tokens:
        text += PARAGRAPH
    bos = int(model.add_bos)  # a model without a BOS (SmolLM2) starts with the text
    tag_tokens = len(model.tokenize(fresh(""))) - bos
    tokens = model.tokenize(text)[bos : n_tokens - tag_tokens + bos]
    return b"".join(model.piece(t) for t in tokens).decode("utf-8", errors="ignore")


def fresh(text: str) -> str:
    """The prompt under a tag never seen before: the prefix cache cannot help, so every
    request pays for its prefill, as the raw loop does (bench_cache.py measures reuse)."""
    return f"Draft {uuid.uuid4().hex[:8]}. {text}"


def best(repeat: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeat))


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="1,2,4,8,16")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    parser.add_argument(
        "--checkout",
        type=Path,
        help="run an older llama-srb checkout's server (a before/after sitting)",
    )
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]

    settings = Settings(model=args.model)
    raw = RawLoop(settings)
    prompt_text = make_prompt(raw.model, args.prompt_tokens)
    rows = []
    server_args = ("--model", args.model)
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), *server_args, checkout=args.checkout) as server,
    ):
        client = httpx.Client(timeout=600)

        def request(n: int, seed: int) -> None:
            body = {
                "prompt": fresh(prompt_text),
                "n": n,
                "max_tokens": args.new_tokens,
                "ignore_eos": True,
                "seed": seed,
            }
            response = client.post(f"{server.api_url}/completions", json=body)
            response.raise_for_status()

        request(1, 0)  # warm-up
        for n in ns:
            raw_run = partial(raw.run, raw.model.tokenize(fresh(prompt_text)), n, args.new_tokens)
            rows.append(measure(n, args, request, raw_run))
            print(f"  n={n} done", file=sys.stderr, flush=True)
        _check_server_alive(server)
    prompt_len = len(raw.model.tokenize(fresh(prompt_text)))
    raw.close()
    print_table(rows, prompt_len, args)


def measure(
    n: int,
    args: argparse.Namespace,
    request: Callable[[int, int], None],
    raw_run: Callable[[], float],
) -> tuple[int, float, float, float, float]:
    def concurrent() -> None:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda seed: request(1, seed), range(n)))

    def sequential() -> None:
        for seed in range(n):
            request(1, seed)

    single = best(args.repeat, lambda: timed(lambda: request(n, 1)))
    together = best(args.repeat, lambda: timed(concurrent))
    one_by_one = best(args.repeat, lambda: timed(sequential))
    limit = best(args.repeat, raw_run)
    return n, single, together, one_by_one, limit


def _check_server_alive(server: RunningServer) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def print_table(
    rows: list[tuple[int, float, float, float, float]], prompt_len: int, args: argparse.Namespace
) -> None:
    new = args.new_tokens
    print(
        f"\n{args.model}: prompt {prompt_len} tokens, {new} new tokens per branch, ignore_eos; "
        f"best of {args.repeat}; wall seconds (generated tok/s)\n"
    )
    print(
        "| n | one request, n | n concurrent, n=1 | n sequential, n=1 | raw llama.cpp loop "
        "| one-n time / sequential | one-n throughput / raw |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, *seconds in rows:
        single, _, sequential, limit = seconds
        cells = " | ".join(f"{s:.2f} s ({n * new / s:.0f})" for s in seconds)
        print(f"| {n} | {cells} | {single / sequential:.2f} | {limit / single:.2f} |")
    print(
        f"\nreproduce: .venv/bin/python bench/bench_batching.py --ns {args.ns} "
        f"--prompt-tokens {args.prompt_tokens} --new-tokens {args.new_tokens} --repeat {args.repeat}"
        + ("" if args.model == DEFAULT else f" --model {args.model}")
    )


if __name__ == "__main__":
    main()

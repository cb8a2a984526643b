"""KV cache types (--cache-type-k / --cache-type-v, K and V alike) on both bundled models:
what a token costs in memory, what that buys, the speed of n=8, and how far greedy text
moves from f16's.

    .venv/bin/python bench/bench_kv_types.py [--models gemma-3-270m,smollm2-135m-instruct]
                                             [--types f16,q8_0,...] [--repeat 3]

Per model and type:

- KV MiB per 1,000 tokens, measured: llama.cpp's state of one sequence
  (`llama_state_seq_get_size`) at 400 tokens less at 200, times 5; every layer's cells with
  their positions (below Gemma 3's 512-token window, where its sliding layers still save
  them all). Beside it the same from ggml's type sizes (`loader.kv_bytes_per_cell`).
- saved MiB: the state of one 1,000-token path, what the host and disk tiers hold (Gemma
  3's sliding layers save only their window).
- the default context: n_ctx of a server started without --n-ctx on this machine (as it
  reports it), and how many 4,000-token stories it holds live; then stories per GiB of KV.
- n=8 tokens/s: one request of 8 x 64 new tokens (seeded, ignore_eos) after a story of
  about 1,900 tokens already in the prefix cache: the best of --repeat.
- greedy agreement with f16: bench_drift.py's 8 fixed prompts, 32 greedy tokens each, on a
  fresh server: the share of tokens before each prompt's first difference from f16's, and
  the prompts whose 32 tokens are all f16's.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_drift import PROMPTS
from llama_srb.bundled_model import BUNDLED
from llama_srb.config import Settings
from llama_srb.kv_types import KvType
from llama_srb.loader import context_options, kv_bytes_per_cell, model_options
from llama_srb.native import Batch, Context, Model
from tests.support.server import RunningServer, run_server

MiB = float(1 << 20)
STORY_TOKENS = 4000  # a story, for "stories live"
GREEDY_TOKENS = 32
N, NEW_TOKENS = 8, 64
PARAGRAPH = (
    " The lighthouse keeper found a letter on the rocks. It said: come to the harbour at dawn,"
    " and bring the key your father left you. Mara read it twice, folded it into her coat, and"
    " climbed the hundred and twelve steps to light the lamp, as she had done every night for"
    " thirty years. The sea below was never quiet; it argued with the rocks, it whispered to"
    " the gulls, and sometimes, in the hour before dawn, it sang."
)
STORY = "Chapter One\n\n" + PARAGRAPH * 20  # about 1,900 tokens on either model


@dataclass
class Row:
    kv_mib: float  # per 1,000 tokens, measured
    computed_mib: float  # per 1,000 tokens, from ggml's sizes
    saved_mib: float  # the state of a 1,000-token path
    n_ctx: int
    tokens_per_s: float
    greedy: list[list[int]]


def state_sizes(model: Model, settings: Settings) -> tuple[float, float]:
    """(MiB per 1,000 tokens of live cells, MiB of a 1,000-token path's saved state)."""
    context = Context(model, context_options(settings, 2048))
    tokens = model.tokenize(STORY)[:1000]
    batch = Batch(200)
    sizes = {}
    try:
        for start in range(0, 1000, 200):
            batch.clear()
            batch.add_span(tokens[start : start + 200], start, 0, False)
            context.decode(batch)
            sizes[start + 200] = len(context.state_get(0))
    finally:
        batch.close()
        context.close()
    return (sizes[400] - sizes[200]) * 5 / MiB, sizes[1000] / MiB


def greedy(server: RunningServer, prompt: str) -> list[int]:
    body = {
        "prompt": prompt,
        "n_predict": GREEDY_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens": True,
    }
    response = httpx.post(f"{server.base_url}/completion", json=body, timeout=600)
    response.raise_for_status()
    return [int(t) for t in response.json()["tokens"]]


def n8_speed(server: RunningServer, repeat: int) -> float:
    """Tokens/s of n=8 x 64 after the story is in the cache: the best of `repeat`."""
    body: dict[str, object] = {"prompt": STORY, "max_tokens": 1, "ignore_eos": True}
    httpx.post(f"{server.api_url}/completions", json=body, timeout=600).raise_for_status()
    best = 0.0
    for seed in range(repeat):
        body = {**body, "n": N, "max_tokens": NEW_TOKENS, "seed": seed, "temperature": 0.9}
        start = time.perf_counter()
        response = httpx.post(f"{server.api_url}/completions", json=body, timeout=600)
        wall = time.perf_counter() - start
        response.raise_for_status()
        best = max(best, response.json()["usage"]["completion_tokens"] / wall)
    return best


def measure(model_name: str, kind: KvType, repeat: int, tmp: Path) -> Row:
    settings = Settings(model=model_name, cache_type_k=kind, cache_type_v=kind)
    model = Model(settings.resolved_model_path(), model_options(settings))
    try:
        kv_mib, saved_mib = state_sizes(model, settings)
        computed = kv_bytes_per_cell(model, kind, kind) * 1000 / MiB
    finally:
        model.close()
    args = ("--model", model_name, "--cache-type-k", kind.value, "--cache-type-v", kind.value)
    with run_server(tmp, *args, "--cache-disk", "0") as server:
        texts = [greedy(server, prompt) for prompt in PROMPTS]  # first: a fresh server
        context = httpx.get(f"{server.base_url}/api/extra/true_max_context_length", timeout=30)
        n_ctx = int(context.json()["value"])
        speed = n8_speed(server, repeat)
    return Row(kv_mib, computed, saved_mib, n_ctx, speed, texts)


def agreement(texts: list[list[int]], reference: list[list[int]]) -> str:
    leading = []
    for tokens, ref in zip(texts, reference, strict=True):
        same = next(
            (i for i, (a, b) in enumerate(zip(tokens, ref, strict=True)) if a != b), len(ref)
        )
        leading.append(same)
    whole = sum(n == GREEDY_TOKENS for n in leading)
    share = 100 * sum(leading) / (GREEDY_TOKENS * len(leading))
    return f"{share:.0f}% ({whole}/{len(leading)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(BUNDLED))
    parser.add_argument("--types", default=",".join(k.value for k in KvType))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    kinds = [KvType(name) for name in args.types.split(",")]
    if KvType.f16 in kinds:  # the reference, measured first
        kinds.remove(KvType.f16)
    kinds.insert(0, KvType.f16)
    print(
        "| model | K and V | KV MiB / 1,000 tokens (ggml's sizes) | saved state of 1,000 tokens,"
        " MiB | default n_ctx: 4,000-token stories live | stories per GiB of KV |"
        " n=8 tokens/s | greedy agreeing with f16 (all 32 alike) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for model_name in args.models.split(","):
        reference: list[list[int]] = []
        for kind in kinds:
            with tempfile.TemporaryDirectory() as tmp:
                row = measure(model_name, kind, args.repeat, Path(tmp))
            reference = reference or row.greedy
            agree = "reference" if kind is KvType.f16 else agreement(row.greedy, reference)
            per_gib = 1024 / (row.kv_mib * STORY_TOKENS / 1000)
            print(
                f"| {model_name} | {kind.value} | {row.kv_mib:.2f} ({row.computed_mib:.2f}) |"
                f" {row.saved_mib:.2f} | {row.n_ctx}: {row.n_ctx // STORY_TOKENS} |"
                f" {per_gib:.1f} | {row.tokens_per_s:.1f} | {agree} |",
                flush=True,
            )
    print(f"\nreproduce: .venv/bin/python bench/bench_kv_types.py {shlex.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

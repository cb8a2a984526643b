"""Host time per branch per step: the engine over a context whose decode costs nothing.

The context holds real logit rows (one real llama_decode of a story, every row kept: 65
rows 262,144 wide for the default model: 64 branches and backend sampling's scratch
token), and its `decode` only puts them back, the next ones in turn: every n samples the
same 65 rows over a run, not only the story's first n
(the first ones are the flattest: a model that has read one word is least sure). A step's
time outside it is all host work: sampling, text, stop strings, deltas, the step's bookkeeping. That
is what a GPU exposes, where a decode step of 8-64 branches takes a few milliseconds.

    .venv/bin/python bench/bench_host.py [--ns 1,8,32,64] [--tokens 48] [--presets a,b]
                                         [--model gemma-3-270m] [--no-sillytavern]
                                         [--decode free|flush|real] [--backend-sampling]

--decode flush streams the model file's size through the caches before each step, as a
CPU decode does reading its weights (the host path then runs from cold caches); --decode
real runs llama_decode itself (host time is still the step's time outside it): together
they tell how much of a CPU server's host time its own decode causes.

--backend-sampling: the server's `--backend-sampling on` (engine/device_cut.py): a
top_k(64) chain on each of the 64 sequence ids. With a free or flushed decode each row's
candidates are recorded with it, its 64 most likely tokens in the order the device's cut
leaves them (most likely first, lower ids first among equals), and put back as its row is.

Every request uses `ignore_eos`, so each branch samples --tokens tokens. Requests are
parsed and built the way the server builds a llama.cpp `/completion` body (the presets:
bench/presets.py), then stepped to the end alone. Prints host ms per branch per step
(total step time / branch-tokens sampled) and ms per step.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.presets import Body, all_presets
from llama_srb.api.input.native import native_params
from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.engine.build import build
from llama_srb.engine.device_cut import DEVICE_TOP_K
from llama_srb.engine.engine import Engine
from llama_srb.engine.kv import KvBudget
from llama_srb.engine.spec import RequestSpec
from llama_srb.loader import model_options
from llama_srb.native import Batch, Context, ContextOptions, Model, has_gpu_device

ROWS = 64  # logit rows kept: the most branches one step samples here
N_CTX = 8192
STORY = (
    "Chapter One\n\nThe lighthouse keeper found a letter on the rocks. It said: come to the"
    " harbour at dawn, and bring the key your father left you. Mara read it twice, folded it"
    " into her coat, and climbed the hundred and twelve steps to light the lamp, as she had"
    " done every night for thirty years. The sea below was never quiet; it argued with the"
    " rocks, it whispered to the gulls, and sometimes, in the hour before dawn, it sang."
)


class FreeDecode:
    """A real context whose `decode` costs nothing: every step reads rows of the one real
    decode made at the start, the recording's next ones in turn (wrapping around)."""

    def __init__(self, model: Model, flush_bytes: int = 0) -> None:
        self.real = Context(model, context_options(device=False))
        # a row more than branches: backend sampling's scratch token has one
        tokens = model.tokenize(STORY * 4)[: ROWS + 1]
        batch = Batch(len(tokens))
        batch.add_span(tokens, 0, 0, True, logits_all=True)
        self.real.decode(batch)
        batch.close()
        # Grammar masks are applied to a row in place, as a real decode's next rows would
        # overwrite them: each decode puts the recorded rows back (counted as decode time).
        self.recorded = self.real.logits().copy()
        # each row's candidates, as the device's cut leaves them (--backend-sampling)
        top = np.argsort(-self.recorded, axis=1, kind="stable")[:, :DEVICE_TOP_K]
        self.recorded_ids = top.astype(np.int32)
        self.recorded_values = np.take_along_axis(self.recorded, top, axis=1)
        self._rows = np.arange(0)  # the recorded rows of the last decode's outputs
        self._weights = np.ones(flush_bytes // 4, np.float32)  # what a CPU decode reads
        self._next = 0  # the recorded row the next decode's first output gets
        self.logits = self.real.logits  # every step reads it: not through __getattr__

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def decode(self, batch: Batch) -> None:
        recorded = len(self.recorded)
        assert batch.n_outputs <= recorded, f"at most {recorded} rows of logits"
        float(self._weights.sum())  # through the caches, as the weights would go
        self.real._n_outputs = n = batch.n_outputs  # what a real decode would have made
        self._rows = rows = (self._next + np.arange(n)) % recorded
        np.take(self.recorded, rows, axis=0, out=self.real.logits())
        self._next = (self._next + n) % recorded

    def candidate_buffers(
        self, rows: Sequence[int], k: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], int]:
        """The last decode's rows' recorded candidates (every row has them here)."""
        at = self._rows
        return self.recorded_ids[at], self.recorded_values[at], min(k, DEVICE_TOP_K)

    def rewind(self) -> None:
        """The next decode starts from the first recorded row again (each run alike)."""
        self._next = 0

    def warm_up(self, token: int) -> None:
        pass


def request_params(model: Model, body: Body, tokens: int) -> Any:
    """The SamplingParams the server builds from this /completion body."""
    body = {**body, "n_predict": tokens, "ignore_eos": True, "prompt": ""}
    if "samplers" in body:  # names llama.cpp's server does not know are skipped, as there
        body["samplers"] = [s for s in body["samplers"] if s.lower() in dialects.SAMPLER_NAMES]
    parsed = NativeCompletionRequest.model_validate(body)
    return native_params(parsed, model, N_CTX, 32)


def context_options(device: bool) -> ContextOptions:
    """The context's shape; with `device`, the server's backend sampling on every id."""
    return ContextOptions(
        n_ctx=N_CTX,
        n_seq_max=ROWS + 8,
        n_batch=512,
        device_top_k=DEVICE_TOP_K if device else 0,
        chained=ROWS if device else 0,
        cpu_cut=not has_gpu_device(),  # as the server chooses it
    )


def run(
    model: Model,
    ctx: FreeDecode | Context,
    body: Body,
    n: int,
    tokens: int,
    seed: int,
    device: bool = False,
) -> tuple[float, int, int]:
    """One request alone, stepped to its end: (seconds, steps, branch-tokens sampled);
    with `device`, backend sampling on."""
    if isinstance(ctx, FreeDecode):
        ctx.rewind()
    budget = KvBudget(ROWS, N_CTX, cache_paths=8, cache_cells=0)
    k, chained = (DEVICE_TOP_K, ROWS) if device else (0, 0)
    engine = Engine(model, ctx, budget, tokens_per_call=0, device_top_k=k, chained=chained)
    params = request_params(model, {**body, "seed": seed}, tokens)
    prompt = model.tokenize(STORY)[:32]
    engine.add(build(model, RequestSpec(prompt, params, n)).take())
    steps = 0
    started = time.perf_counter()
    while engine.has_work:
        for output in engine.step():
            if output.error is not None:
                raise RuntimeError(f"{body}: {output.error}")
        steps += 1
    elapsed = time.perf_counter() - started - engine.stats.decode_seconds  # the host's
    sampled = engine.branch_step.drawn  # a greedy request decodes one branch for all
    engine.close()
    return elapsed, steps, sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--presets", default="", help="comma-separated names (default: all)")
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    parser.add_argument("--repeat", type=int, default=1, help="best of R runs per cell")
    parser.add_argument("--no-sillytavern", action="store_true", help="skip its presets")
    parser.add_argument("--decode", choices=("free", "flush", "real"), default="free")
    parser.add_argument("--backend-sampling", action="store_true", help="the device's cut on")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    assert max(ns) <= ROWS, f"at most {ROWS} branches"

    settings = Settings(model=args.model)
    path = settings.resolved_model_path()
    model = Model(path, model_options(settings))
    ctx: FreeDecode | Context
    if args.decode == "real":
        ctx = Context(model, context_options(args.backend_sampling))
    else:
        ctx = FreeDecode(model, path.stat().st_size if args.decode == "flush" else 0)
    presets = all_presets(with_sillytavern=not args.no_sillytavern)
    if args.presets:
        presets = {name: presets[name] for name in args.presets.split(",")}

    decode = {"free": "costs nothing", "flush": "costs nothing but cold caches", "real": "real"}
    print(
        f"\n{args.model}: {args.tokens} tokens per branch, ignore_eos; decode {decode[args.decode]}"
        + ("; backend sampling on" if args.backend_sampling else "")
    )
    print("host ms per branch per step (ms per step)\n")
    print("| preset | " + " | ".join(f"n={n}" for n in ns) + " |")
    print("|---|" + "---:|" * len(ns))
    for name, body in presets.items():
        cells = []
        for n in ns:
            best = min(
                (
                    run(model, ctx, body, n, args.tokens, seed, args.backend_sampling)
                    for seed in range(args.repeat)
                ),
                key=lambda r: r[0],
            )
            seconds, steps, sampled = best
            cells.append(f"{seconds / sampled * 1e3:.3f} ({seconds / steps * 1e3:.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print(
        "\nreproduce: .venv/bin/python bench/bench_host.py"
        f" --ns {args.ns} --tokens {args.tokens}"
        + (f" --presets {args.presets}" if args.presets else "")
        + (f" --repeat {args.repeat}" if args.repeat != 1 else "")
        + (" --no-sillytavern" if args.no_sillytavern else "")
        + ("" if args.model == DEFAULT else f" --model {args.model}")
        + ("" if args.decode == "free" else f" --decode {args.decode}")
        + (" --backend-sampling" if args.backend_sampling else "")
    )
    ctx.close()  # FreeDecode passes it to its real context
    model.close()


if __name__ == "__main__":
    main()

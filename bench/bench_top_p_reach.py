"""How far a top-p reaches past the device's cut (backend sampling, docs/sampling.md): on
both bundled models' real rows, how often its kept set can be found from the K candidates
the device leaves, with and without the row's normalizer.

    .venv/bin/python bench/bench_top_p_reach.py [--ks 64,256,1024] [--ps 0.9,0.95]
                                                [--temperatures 0.7,1,1.25] [--rows 256]
                                                [--n 8]

The rows: one real llama_decode of a story (bench_host's, the first --rows tokens), every
row kept. For each row, temperature T (before the top-p, as SillyTavern's Default puts 1),
top-p p and cut K, llama.cpp's top-p keeps the most likely tokens up to the first whose
running sum of weights exp((logit - max) / T) reaches p of the row's sum Z:

- *candidates alone*: every token off the list is at most the K-th's logit, so Z lies
  between the K's own sum and that plus (vocabulary - K) times the K-th's weight; the kept
  set is decided when it ends inside the K, at the same token for both ends;
- *with the normalizer*: Z is known as well (the device would have to sum every row's
  weights at T); decided when the kept set ends inside the K.

Prints the share of rows decided, and of calls of --n rows that are all decided (the n-th
power: rows taken as independent). One undecided row in a call makes llama.cpp copy every
row of it (engine/device_cut.py), so the second share is what a request would keep.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import llama_cpp as C
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_host import STORY
from llama_srb.bundled_model import BUNDLED
from llama_srb.config import Settings
from llama_srb.loader import model_options
from llama_srb.native import Batch, Context, ContextOptions, Model


def story_rows(name: str, n_rows: int) -> npt.NDArray[np.float64]:
    """The logit rows of one decode of the story's first n_rows tokens."""
    settings = Settings(model=name)
    model = Model(settings.resolved_model_path(), model_options(settings))
    ctx = Context(model, ContextOptions(n_ctx=2048, n_seq_max=1, n_batch=max(n_rows, 32)))
    tokens = model.tokenize(STORY * 4)[:n_rows]
    batch = Batch(len(tokens))
    batch.add_span(tokens, 0, 0, True, logits_all=True)
    ctx.decode(batch)
    rows = ctx.logits().astype(np.float64)
    batch.close()
    ctx.close()
    model.close()
    return rows


def kept(sums: npt.NDArray[np.float64], z: float, p: float) -> int | None:
    """How many tokens top-p keeps, when its edge is among these running sums."""
    reached = np.flatnonzero(sums >= p * z)
    return int(reached[0]) + 1 if len(reached) else None


def decided(row: npt.NDArray[np.float64], t: float, p: float, k: int) -> tuple[bool, bool]:
    """(from the candidates alone, with the normalizer) for one row, most likely first."""
    weights = np.exp((row - row[0]) / t)
    sums = np.cumsum(weights[:k])
    least = float(sums[-1])  # Z if every token off the list weighed nothing
    most = least + (len(row) - k) * float(weights[k - 1])  # if each weighed the K-th's
    alone = kept(sums, least, p)
    known = kept(sums, float(weights.sum()), p)
    return alone is not None and alone == kept(sums, most, p), known is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default="64,256,1024")
    parser.add_argument("--ps", default="0.9,0.95")
    parser.add_argument("--temperatures", default="0.7,1,1.25")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--n", type=int, default=8, help="rows of one call")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    ps = [float(p) for p in args.ps.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    quiet = C.llama_log_callback(lambda *_: None)  # kept: llama.cpp calls it from C
    C.llama_log_set(quiet, ctypes.c_void_p())

    print(f"\nrows decided, candidates alone / with the normalizer (calls of {args.n})\n")
    print("| model | T | top-p | " + " | ".join(f"K = {k}" for k in ks) + " |")
    print("|---|---:|---:|" + "---:|" * len(ks))
    for name in BUNDLED:
        rows = -np.sort(-story_rows(name, args.rows), axis=1)  # most likely first
        for t in temperatures:
            for p in ps:
                cells = []
                for k in ks:
                    both = np.array([decided(row, t, p, k) for row in rows])
                    alone, known = both.mean(axis=0)
                    cells.append(
                        f"{alone:.0%} / {known:.0%} ({alone**args.n:.0%} / {known**args.n:.0%})"
                    )
                print(f"| {name} | {t:g} | {p:g} | " + " | ".join(cells) + " |", flush=True)
    print(
        "\nreproduce: .venv/bin/python bench/bench_top_p_reach.py"
        f" --ks {args.ks} --ps {args.ps} --temperatures {args.temperatures}"
        f" --rows {args.rows} --n {args.n}"
    )


if __name__ == "__main__":
    main()

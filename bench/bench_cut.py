"""What each cut of the sampler's first filter costs on one row (sampling/cut.py), alone.

    .venv/bin/python bench/bench_cut.py [--repeat 20] [--model gemma-3-270m]

The rows are bench_host's recording: one real llama_decode of a story, its 65 logit rows
(262,144 wide for the default model). Each operation runs on a fresh Row of every row in
turn, its column maxima read just before (warm, as the engine reads a row just before its
branches sample), except `column maxima, cold`, which first streams every other row
through the caches. Prints µs per row: the mean over the rows of each row's best of
--repeat, and the slowest row's.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_host import FreeDecode
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.loader import model_options
from llama_srb.native import Model
from llama_srb.sampling.cut import Row, top_p

Operation = Callable[[Row], object]
Rows = npt.NDArray[np.float32]

OPERATIONS: dict[str, Operation] = {
    "argmax (greedy)": Row.argmax,
    "top-k 40": lambda row: row.top_k(40),
    "min-p 0.05": lambda row: row.at_least(row.max + math.log(0.05)),
    "top-p 0.95 capped by min-p 0.01": lambda row: top_p(
        row, 0.95, 1.0, row.at_least(row.max + math.log(0.01))
    ),
    "top-p 0.95 alone": lambda row: top_p(row, 0.95),
    "the whole normalizer": lambda row: row.mass(row.max, 1.0),
    "the whole normalizer, temperature 0.7": lambda row: row.mass(row.max, 1 / 0.7),
    "a draw from every token": lambda row: row.draw(1.0, np.random.default_rng(0)),
}


def each_row(rows: Rows, measure: Callable[[Rows, int], float], repeat: int) -> list[float]:
    """Seconds per row: the best of `repeat` measures of each."""
    return [min(measure(rows, i) for _ in range(repeat)) for i in range(len(rows))]


def maxima(cold: bool) -> Callable[[Rows, int], float]:
    def measure(rows: Rows, i: int) -> float:
        for other in rows[np.arange(len(rows)) != i] if cold else rows[i : i + 1]:
            float(other.max())  # cold: through the caches, row i then comes from memory
        started = time.perf_counter()
        Row(rows[i]).read_maxima()
        return time.perf_counter() - started

    return measure


def warm(operation: Operation) -> Callable[[Rows, int], float]:
    def measure(rows: Rows, i: int) -> float:
        row = Row(rows[i])
        row.read_maxima()  # as the engine reads a row's maxima just before its cuts
        started = time.perf_counter()
        operation(row)
        return time.perf_counter() - started

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="best of R per row")
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    args = parser.parse_args()
    settings = Settings(model=args.model)
    model = Model(settings.resolved_model_path(), model_options(settings))
    recording = FreeDecode(model)
    rows = recording.recorded
    print(f"\n{args.model}: {len(rows)} recorded rows of {rows.shape[1]:,} logits")
    print(f"µs per row (mean of each row's best of {args.repeat}; slowest row)\n")
    print("| operation | mean | slowest |")
    print("|---|---:|---:|")
    per_row = {
        "column maxima, cold": each_row(rows, maxima(cold=True), 3),
        "column maxima, warm": each_row(rows, maxima(cold=False), args.repeat),
    }
    for name, operation in OPERATIONS.items():
        per_row[name] = each_row(rows, warm(operation), args.repeat)
    for name, seconds in per_row.items():
        print(f"| {name} | {np.mean(seconds) * 1e6:.1f} | {max(seconds) * 1e6:.1f} |")
    print(
        "\nreproduce: .venv/bin/python bench/bench_cut.py"
        + (f" --repeat {args.repeat}" if args.repeat != 20 else "")
        + ("" if args.model == DEFAULT else f" --model {args.model}")
    )
    recording.close()
    model.close()


if __name__ == "__main__":
    main()

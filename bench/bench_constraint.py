"""llguidance masks on the bundled model's vocabulary: µs per row for a JSON schema, a regex
and a GBNF grammar at 1/8/32 matchers in one batched call, applying a mask to a logits row,
and how long the Known-limits inputs take to their end.

    .venv/bin/python bench/bench_constraint.py [--steps 12] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import bundled_model_path
from llama_srb.native import Model, native_thread
from llama_srb.sampling.constraint import ConstraintKind, ConstraintSpec, constraints_for
from llama_srb.sampling.cut import Row
from llama_srb.sampling.masks import MaskBatch, allowed_tokens
from llama_srb.sampling.params import ParamError
from tests.support.pathological import chain

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
KINDS: dict[str, tuple[ConstraintKind, str | dict[str, Any]]] = {
    "JSON schema": (ConstraintKind.JSON_SCHEMA, SCHEMA),
    "regex": (ConstraintKind.REGEX, r"[A-Z][a-z]+( [a-z]+){2,12}\."),
    "GBNF": (ConstraintKind.GBNF, 'root ::= "- " [a-zA-Z ,]+ "\\n" ("- " [a-zA-Z ,]+ "\\n")*'),
}


PATHOLOGICAL = {
    "1,600 chained alternatives (64 KiB)": (ConstraintKind.GBNF, chain(1600), "w"),
    "950 chained alternatives": (ConstraintKind.GBNF, chain(950), "w"),
    'root ::= ("a"|"a")*': (ConstraintKind.GBNF, 'root ::= ("a"|"a")*', "a"),
    "pattern ^((a{0,100}){0,100}){0,100}$": (
        ConstraintKind.JSON_SCHEMA,
        {"type": "string", "pattern": "^((a{0,100}){0,100}){0,100}$"},
        "a",
    ),
}


def masks_table(model: Model, steps: int, threads: int | None) -> None:
    constraints = constraints_for(model)
    batch = MaskBatch(model.n_vocab, threads)
    print("| constraint | matchers | µs per row (median step) | worst step, ms |")
    print("|---|---:|---:|---:|")
    for name, (kind, source) in KINDS.items():
        for n in (1, 8, 32):
            compiled = constraints.compile(ConstraintSpec(kind, source, "p"))
            matchers = [compiled.matcher() for _ in range(n)]
            rng = np.random.default_rng(0)
            times = []
            for _ in range(steps):
                started = time.perf_counter()
                rows = batch.fill(matchers)
                times.append(time.perf_counter() - started)
                for i, m in enumerate(matchers):  # each its own way through the grammar
                    ids = allowed_tokens(rows[i], model.n_vocab)
                    ids = ids[~np.isin(ids, model.eog_tokens)]
                    if len(ids) and not m.is_stopped:
                        m.consume(int(rng.choice(ids)))
            median = float(np.median(times))
            print(f"| {name} | {n} | {median / n * 1e6:.0f} | {max(times) * 1e3:.1f} |")
    logits = np.random.default_rng(1).standard_normal(model.n_vocab).astype(np.float32)
    json_schema = ConstraintSpec(ConstraintKind.JSON_SCHEMA, SCHEMA, "p")
    row = batch.fill([constraints.compile(json_schema).matcher()])
    for label, fn in (
        ("Row.mask (row → -inf where refused, column maxima)", lambda: Row(logits).mask(row[0])),
        ("allowed_tokens (ids of a row)", lambda: allowed_tokens(row[0], model.n_vocab)),
    ):
        started = time.perf_counter()
        for _ in range(200):
            fn()
        print(f"{label}: {(time.perf_counter() - started) / 200 * 1e6:.0f} µs")


def pathological_table(model: Model) -> None:
    constraints = constraints_for(model)
    batch = MaskBatch(model.n_vocab)
    print("\n| input (8 branches, ≤ 64 steps) | compile | to its end | how it ends |")
    print("|---|---:|---:|---|")
    for name, (kind, source, letter) in PATHOLOGICAL.items():
        result: list[str] = []

        def run(
            kind: ConstraintKind = kind,
            source: object = source,
            letter: str = letter,
            result: list[str] = result,
        ) -> None:
            started = time.perf_counter()
            try:
                compiled = constraints.compile(ConstraintSpec(kind, source, "p"))  # type: ignore[arg-type]
            except ParamError as exc:
                result.extend([f"{time.perf_counter() - started:.3f} s", "—", f"400: {exc}"[:90]])
                return
            compiled_at = time.perf_counter()
            matchers = [compiled.matcher() for _ in range(8)]
            (preferred,) = model.tokenize(letter, add_special=False, parse_special=False)
            end = "64 steps, no error"
            for step in range(64):
                rows = batch.fill(matchers)
                if matchers[0].error:
                    end = f"error at step {step}: {matchers[0].error}"[:90]
                    break
                ids = allowed_tokens(rows[0], model.n_vocab)
                token = preferred if preferred in ids else int(ids[0])
                if token in model.eog_tokens:
                    end = f"complete after {step} tokens"
                    break
                for m in matchers:
                    m.consume(token)
            result.extend(
                [
                    f"{compiled_at - started:.3f} s",
                    f"{time.perf_counter() - compiled_at:.3f} s",
                    end.replace("\n", " "),
                ]
            )

        native_thread(run, "bench").join()
        print(f"| {name} | " + " | ".join(result) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    model = Model(bundled_model_path())
    started = time.perf_counter()
    assert constraints_for(model).tokenizer.vocab_size == model.n_vocab  # built here
    print(f"tokenizer for {model.n_vocab} tokens: {time.perf_counter() - started:.2f} s\n")
    masks_table(model, args.steps, args.threads)
    pathological_table(model)
    print(f"\nreproduce: .venv/bin/python bench/bench_constraint.py --steps {args.steps}")


if __name__ == "__main__":
    main()

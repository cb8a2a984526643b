"""What banned patterns (`banned_regex`) cost and how often they take a branch back.

    .venv/bin/python bench/bench_banned_regex.py [--model gemma-3-270m] [--n 8]
                                                 [--max-tokens 64] [--no-server]

1. Host cost, in process (no server, no decoding): n text streams, as the engine keeps
   one per branch, push the tokens of a story passage with 0, 1, 16 and 128 patterns
   (the first pattern of the example list; the example list; the example list and 112
   more that never match). µs per branch and token, the longest hold-back seen, and the
   first compile of the list (cached after it).
2. Rewinds, against a server on the bundled model: the example list over fixed story
   openings, n branches each, ignore_eos, fixed seeds. Without the list: how many of its
   matches the branches write; with it: how many tokens were drawn and taken back
   (llama_srb_generated_tokens - completion tokens), and that no branch holds a match.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import re2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import DEFAULT, bundled_model_path
from llama_srb.native import Model
from llama_srb.sampling.patterns import compiled
from llama_srb.sampling.slop import EXAMPLE_SLOP_PATTERNS
from llama_srb.sampling.text import TextStream
from tests.support.server import RunningServer, run_server

PASSAGE = (
    "The lighthouse keeper climbed the stairs one last time. At the top he set the lamp"
    " down and looked out over the water, where the fishing boats were coming home in a"
    " long grey line. His hands were stiff from the cold and the rail was slick with salt."
    " He thought of the letter in his coat, the one from his daughter, and of the words he"
    " had never managed to write back. Below, the harbour bells rang the hour, and a gull"
    " settled on the parapet beside him, watching the lamp as if it, too, were waiting. "
) * 4
OPENINGS = [
    "Her knuckles tightened on the railing as the storm rolled in. She",
    "It was not the first time the captain had lied to his crew, but",
    "The letter trembled in his hands. Her voice, when she finally spoke, was",
    "Nobody in the village spoke of the house on the hill, but that night",
]
NEVER = tuple(rf"\bzq{i}\w* (?:of|in) the \w+" for i in range(112))
SETS: dict[str, tuple[str, ...]] = {
    "0 patterns": (),
    "1 pattern": EXAMPLE_SLOP_PATTERNS[:1],
    f"{len(EXAMPLE_SLOP_PATTERNS)} patterns (example list)": EXAMPLE_SLOP_PATTERNS,
    f"{len(EXAMPLE_SLOP_PATTERNS) + len(NEVER)} patterns": EXAMPLE_SLOP_PATTERNS + NEVER,
}


def host_cost(model_name: str, n: int, repeat: int = 3) -> list[str]:
    model = Model(bundled_model_path(model_name))
    try:
        tokens = model.tokenize(PASSAGE, add_special=False)
        text = model.text(tokens)
        rows = [
            f"Host cost: {n} branches each pushing {len(tokens)} tokens of prose (best of"
            f" {repeat}).\n",
            "| patterns | first compile (ms) | µs per branch and token | longest hold (chars) |",
            "|---|---:|---:|---:|",
        ]
        for name, patterns in SETS.items():
            compiled.cache_clear()
            started = time.perf_counter()
            pattern_set = compiled(patterns, False) if patterns else None
            compile_ms = (time.perf_counter() - started) * 1e3
            if pattern_set is not None:
                assert not any(re2.search(f"(?i){p}", text) for p in patterns), name
            best, hold = float("inf"), 0
            for _ in range(repeat):
                streams = [TextStream(model.piece, (), (), False, pattern_set) for _ in range(n)]
                started = time.perf_counter()
                for token in tokens:
                    for stream in streams:
                        stream.push(token, True)
                    if pattern_set is not None:
                        guard = streams[0]._guard
                        assert guard is not None
                        hold = max(hold, len(guard._window))
                best = min(best, time.perf_counter() - started)
            per = best / (n * len(tokens)) * 1e6
            rows.append(f"| {name} | {compile_ms:.1f} | {per:.1f} | {hold} |")
        return rows
    finally:
        model.close()


def metric(server: RunningServer, name: str) -> float:
    for line in httpx.get(f"{server.base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def rewinds(server: RunningServer, n: int, max_tokens: int) -> list[str]:
    families = [re2.compile(f"(?i){p}") for p in EXAMPLE_SLOP_PATTERNS]
    rows = [
        f"\nRewinds with the example list: {len(OPENINGS)} openings × n={n}, {max_tokens}"
        " tokens each, ignore_eos, seeds 1..\n",
        "| run | kept tokens | drawn tokens | taken back | matches in the text |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, extra in (("without", {}), ("with", {"banned_regex": list(EXAMPLE_SLOP_PATTERNS)})):
        kept = matches = 0
        drawn_before = metric(server, "llama_srb_generated_tokens_total")
        for seed, opening in enumerate(OPENINGS, start=1):
            body: dict[str, Any] = {
                "prompt": opening,
                "n": n,
                "max_tokens": max_tokens,
                "seed": seed,
                "ignore_eos": True,
                "temperature": 1.0,
                **extra,
            }
            reply = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
            reply.raise_for_status()
            data = reply.json()
            kept += data["usage"]["completion_tokens"]
            for choice in data["choices"]:
                matches += sum(len(list(f.finditer(choice["text"]))) for f in families)
        drawn = metric(server, "llama_srb_generated_tokens_total") - drawn_before
        rows.append(f"| {name} | {kept} | {drawn:.0f} | {drawn - kept:.0f} | {matches} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-server", action="store_true", help="the host cost only")
    args = parser.parse_args()
    rows = host_cost(args.model, args.n)
    if not args.no_server:
        with (
            tempfile.TemporaryDirectory() as tmp,
            run_server(Path(tmp), "--model", args.model, "--n-ctx", "4096") as server,
        ):
            rows += rewinds(server, args.n, args.max_tokens)
    print("\n".join(rows))


if __name__ == "__main__":
    main()

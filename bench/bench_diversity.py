"""How different the n branches are, with and without each way of choosing between them
(banned phrases, distinct openings, best_of, a per-branch temperature spread), and what
each costs in throughput; side by side in one run, against one server.

    .venv/bin/python bench/bench_diversity.py [--n 8] [--max-tokens 48] [--repeat 3]
                                              [--model gemma-3-270m]

Per configuration, over fixed story openings, n branches each (fixed seeds):
- first sentences: the share of the n branches whose first sentence no other branch has;
- distinct-2 / distinct-3: distinct word bigrams / trigrams over all, pooled per opening;
- stock phrases: occurrences of STOCK per branch;
- tok/s: generated tokens (every branch best_of decodes) over wall time.
The overhead table runs the same greedy-free request (ignore_eos, same seed) with and
without a list of banned phrases that never occur, interleaved, best of --repeat: the
tokens are identical, so the difference is the cost of looking for phrases.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import DEFAULT, bundled_model_path
from llama_srb.native import Model
from llama_srb.sampling.text import TextStream
from tests.support.server import RunningServer, run_server

OPENINGS = [
    "The old lighthouse keeper climbed the stairs one last time. At the top, he",
    "Mara found the letter under the floorboards of her grandmother's kitchen. It began:",
    "The dragon had not left its cave in a hundred years, until the morning when",
    "Nobody in the village spoke of the house on the hill, but that night",
]
# Phrases writers call slop, and the stock openings a small model leans on.
STOCK = [
    "suddenly",
    "a testament to",
    "shivers down",
    "barely above a whisper",
    "couldn't help but",
    "little did",
    "the weight of",
    "for a moment",
    "a sense of",
    "in the distance",
    "once upon a time",
    "he saw",
    "she saw",
]
NEVER = [f"zq{i}xv phrase" for i in range(len(STOCK))]  # as many phrases, never written
SENTENCE_END = re.compile(r"[.!?\n]")


def first_sentence(text: str, words: int = 6) -> str:
    """The first sentence, or its first `words` words: how a branch opens."""
    match = SENTENCE_END.search(text.strip())
    head = text.strip()[: match.start()] if match else text.strip()
    return " ".join(head.lower().split()[:words])


def distinct(texts: list[str], k: int) -> float:
    grams = [
        tuple(words[i : i + k])
        for words in (t.lower().split() for t in texts)
        for i in range(len(words) - k + 1)
    ]
    return len(set(grams)) / len(grams) if grams else 0.0


def stock_count(text: str) -> int:
    low = text.lower()
    return sum(low.count(p) for p in STOCK)


def spread(n: int, t: float = 0.8, s: float = 0.4) -> list[dict[str, float]]:
    return [{"temperature": round(t - s + 2 * s * i / (n - 1), 3)} for i in range(n)]


def configs(n: int) -> dict[str, dict[str, Any]]:
    return {
        "baseline": {},
        "banned_strings (STOCK)": {"banned_strings": STOCK},
        "distinct_openings": {"distinct_openings": True},
        f"best_of={2 * n}": {"best_of": 2 * n},
        "temperature spread 0.4-1.2": {"choices_params": spread(n)},
        "all four": {
            "banned_strings": STOCK,
            "distinct_openings": True,
            "best_of": 2 * n,
            "choices_params": spread(2 * n),
        },
    }


def complete(server: RunningServer, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=1800)
    response.raise_for_status()
    return response.json(), time.perf_counter() - started


def diversity(server: RunningServer, n: int, max_tokens: int) -> list[str]:
    rows = [
        "| configuration | distinct first sentences | distinct-2 | distinct-3"
        " | stock phrases / branch | tok/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    sums: dict[str, list[float]] = {name: [0.0] * 6 for name in configs(n)}
    for i, opening in enumerate(OPENINGS):  # configurations interleaved: noise hits all
        for name, extra in configs(n).items():
            body = {"prompt": opening, "n": n, "max_tokens": max_tokens, "seed": 100 + i}
            out, wall = complete(server, {**body, **extra})
            texts = [c["text"] for c in out["choices"]]
            sentences = [first_sentence(t) for t in texts]
            row = sums[name]
            row[0] += sum(sentences.count(s) == 1 for s in sentences) / n
            row[1] += distinct(texts, 2)
            row[2] += distinct(texts, 3)
            row[3] += sum(stock_count(t) for t in texts) / n
            row[4] += out["usage"]["completion_tokens"]
            row[5] += wall
    k = len(OPENINGS)
    for name, (firsts, d2, d3, stock, tokens, seconds) in sums.items():
        rows.append(
            f"| {name} | {firsts / k:.2f} | {d2 / k:.2f} | {d3 / k:.2f} | {stock / k:.2f}"
            f" | {tokens / seconds:.1f} |"
        )
    return rows


def overhead(server: RunningServer, n: int, tokens: int, repeat: int) -> list[str]:
    base = {"prompt": OPENINGS[0], "n": n, "max_tokens": tokens, "seed": 7, "ignore_eos": True}
    sides: dict[str, dict[str, Any]] = {
        "without banned_strings": base,
        f"with {len(NEVER)} banned phrases (none written)": {**base, "banned_strings": NEVER},
    }
    best: dict[str, float] = {}
    texts: dict[str, list[str]] = {}
    for round_ in range(repeat):  # interleaved, in turn first, so noise hits both sides
        for name, body in sorted(sides.items(), reverse=round_ % 2 == 1):
            out, wall = complete(server, body)
            best[name] = max(best.get(name, 0.0), out["usage"]["completion_tokens"] / wall)
            texts[name] = [c["text"] for c in out["choices"]]
    same = len({tuple(t) for t in texts.values()}) == 1
    without = best[next(iter(sides))]
    rows = [
        f"| n={n}, {tokens} tokens each | tok/s (best of {repeat}) | vs without |",
        "|---|---:|---:|",
    ]
    for name in sides:
        rows.append(f"| {name} | {best[name]:.1f} | {100 * (best[name] / without - 1):+.1f}% |")
    rows.append(f"\nSame tokens on both sides: {'yes' if same else 'NO'}.")
    return rows


def guard_cost(model_name: str, text: str) -> str:
    """The text stream's own cost per token with and without the phrases, in process (no
    server, no noise from decoding): what banned strings add to each branch's token."""
    model = Model(bundled_model_path(model_name))
    try:
        tokens = model.tokenize(text, add_special=False)
        per_token = {}
        for name, banned in (("without", ()), ("with", NEVER)):
            started = time.perf_counter()
            for _ in range(20):
                stream = TextStream(model.piece, (), banned)
                for token in tokens:
                    stream.push(token, True)
                stream.flush()
            per_token[name] = (time.perf_counter() - started) / (20 * len(tokens))
    finally:
        model.close()
    extra = per_token["with"] - per_token["without"]
    return (
        f"Text stream per token and branch: {per_token['without'] * 1e6:.1f} µs without,"
        f" {per_token['with'] * 1e6:.1f} µs with {len(NEVER)} banned phrases"
        f" (+{extra * 1e6:.1f} µs)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--overhead-tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), "--model", args.model, "--n-ctx", "8192") as server,
    ):
        table = diversity(server, args.n, args.max_tokens)
        cost = overhead(server, args.n, args.overhead_tokens, args.repeat)
        sample = complete(server, {"prompt": OPENINGS[1], "max_tokens": 256, "seed": 3})[0]
    cost.append(guard_cost(args.model, sample["choices"][0]["text"]))
    print(
        f"Command: .venv/bin/python bench/bench_diversity.py --n {args.n}"
        f" --max-tokens {args.max_tokens} --overhead-tokens {args.overhead_tokens}"
        f" --repeat {args.repeat} --model {args.model}\n"
    )
    print(f"n={args.n}, {len(OPENINGS)} story openings, {args.max_tokens} tokens per branch:\n")
    print("\n".join(table))
    print("\nThe cost of banned strings when nothing is banned:\n")
    print("\n".join(cost))


if __name__ == "__main__":
    main()

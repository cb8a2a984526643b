"""The prefix cache, measured: swipes, tree walks on long stories, writers taking turns,
and what idle cached cells cost.

    .venv/bin/python bench/bench_cache.py [--parts swipes,walks,writers,tax] [--n-ctx N]
                                          [--model gemma-3-270m]

1. Swipes: 8 concurrent requests with n=1 and the same ~512-token prompt vs one request
   with n=8 (each on a prompt not seen before, --swipe-tokens new tokens, ignore_eos).
2. Tree walks: a story of W words (--walk-words; `end` is one that fills --end-fraction of
   the context), n=4, --new-tokens per branch: the story (cold); continue from branch A;
   from A's first child; then back to branch B of the first round. Time to first token
   and prompt tokens from the cache of each step. All walks share one server, in order.
3. Writers: --writers writers on stories of --writer-words words take turns, each doing
   the four steps of a tree walk: time to first token and the cached share of each step.
4. Cache tax: the llama_decode time of a decode step of an n=8 request and of a 512-token
   prefill chunk (from /metrics, best of --tax-repeat probes) with an empty cache, then
   after each of --tax-stories (unrelated stories, in tokens) is parked; against what a
   hit on that story saves (read cold, then again from the cache).

Each part runs on a server of its own with the default settings (but --model and --n-ctx,
if given).
All parts take about 10 minutes on 2 CPU cores, most of it the near-end walk's cold read.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.bundled_model import DEFAULT
from tests.support.server import RunningServer, run_server

SENTENCES = [
    "The lighthouse keeper counted the steps as he climbed, one hundred and twelve of them.",
    "Below, the sea argued with the rocks and the gulls wheeled over the harbour.",
    "Mara had kept the light for thirty years, since the winter her father's boat was lost.",
    "Every night she wrote one line in the logbook, and every morning she read it again.",
    "The village believed the lamp had a will of its own, and she never told them otherwise.",
]
PREFILL_CHUNK = 512  # the server's default --n-batch


def story(words: int) -> str:
    """A fresh story of about `words` words (a new prefix, so nothing of it is cached)."""
    text, count, i = [uuid.uuid4().hex + "."], 0, 0
    while count < words:
        sentence = SENTENCES[i % len(SENTENCES)]
        text.append(sentence)
        count += len(sentence.split())
        i += 1
    return " ".join(text)


@dataclass
class Step:
    name: str
    ttft: float
    cached: int
    prompt_tokens: int


class Client:
    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.url = f"{server.api_url}/completions"
        self.http = httpx.Client(timeout=1200)

    def complete(self, prompt: str | list[int], n: int, new_tokens: int, seed: int = 0) -> dict:
        body = {"prompt": prompt, "n": n, "max_tokens": new_tokens, "ignore_eos": True}
        response = self.http.post(self.url, json={**body, "seed": seed})
        response.raise_for_status()
        return response.json()

    def tokenize(self, text: str) -> list[int]:
        response = self.http.post(f"{self.server.base_url}/tokenize", json={"content": text})
        response.raise_for_status()
        return list(response.json()["tokens"])

    def stream(self, name: str, prompt: str, n: int, new_tokens: int) -> tuple[Step, list[str]]:
        """One streamed request: its step (time to first token, cached tokens) and texts."""
        body = {
            "prompt": prompt,
            "n": n,
            "max_tokens": new_tokens,
            "ignore_eos": True,
            "seed": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        texts = [""] * n
        started = time.perf_counter()
        first = 0.0
        usage: dict = {}
        with self.http.stream("POST", self.url, json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    first = first or time.perf_counter()
                    texts[choice["index"]] += choice["text"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        return Step(name, first - started, cached, usage["prompt_tokens"]), texts


@contextmanager
def server(
    tmp: Path, model: str, n_ctx: int | None, checkout: Path | None = None
) -> Iterator[tuple[RunningServer, Client]]:
    args = ["--model", model, *(["--n-ctx", str(n_ctx)] if n_ctx else [])]
    with run_server(tmp, *args, checkout=checkout) as running:
        client = Client(running)
        client.complete("warm-up", 1, 4)
        yield running, client


# -- the parts -------------------------------------------------------------------------------


def swipes(client: Client, new_tokens: int) -> tuple[float, float]:
    prompt = story(400)
    started = time.perf_counter()
    client.complete(prompt, 8, new_tokens)
    one_n8 = time.perf_counter() - started
    prompt = story(400)
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda seed: client.complete(prompt, 1, new_tokens, seed), range(8)))
    return one_n8, time.perf_counter() - started


def tree_walk(client: Client, root: str, new_tokens: int, label: str = "") -> Iterator[Step]:
    """The writer's loop on one story; yields each step as soon as it is done."""
    step, first_round = client.stream(f"{label}story, n=4 (cold)", root, 4, new_tokens)
    yield step
    branch_a = root + first_round[0]
    step, second_round = client.stream(f"{label}continue branch A", branch_a, 4, new_tokens)
    yield step
    child = branch_a + second_round[0]
    yield client.stream(f"{label}continue A's first child", child, 4, new_tokens)[0]
    yield client.stream(f"{label}back to branch B", root + first_round[1], 4, new_tokens)[0]


def words_for(client: Client, tokens: int) -> int:
    """Words of `story` that make about `tokens` tokens."""
    sample = story(2000)
    return int(tokens * len(sample.split()) / len(client.tokenize(sample)))


@dataclass
class Walk:
    words: int
    n_ctx: int
    steps: list[Step]

    @property
    def heading(self) -> str:
        tokens = self.steps[0].prompt_tokens
        return f"{self.words:,} words ({tokens:,} tokens, {tokens / self.n_ctx:.0%} of n_ctx)"


def walks(client: Client, sizes: list[str], end_fraction: float, new_tokens: int) -> list[Walk]:
    done = []
    n_ctx = int(client.server.metric("llama_srb_kv_cells_total"))
    for size in sizes:
        words = words_for(client, int(end_fraction * n_ctx)) if size == "end" else int(size)
        done.append(Walk(words, n_ctx, list(tree_walk(client, story(words), new_tokens))))
        print(f"  walk of {words} words done", file=sys.stderr, flush=True)
    return done


def writers(client: Client, count: int, words: int, new_tokens: int) -> list[list[Step]]:
    """`count` writers take turns: each does one step of its tree walk per turn."""
    walkers = [tree_walk(client, story(words), new_tokens) for _ in range(count)]
    table: list[list[Step]] = [[] for _ in range(4)]
    for step in range(4):
        for walker in walkers:
            table[step].append(next(walker))
    return table


@dataclass
class TaxRow:
    cells: float  # idle cached cells while the probes ran (their mean)
    decode_step: float  # seconds of llama_decode per step of an n=8 request
    prefill_chunk: float  # seconds of llama_decode per 512-token prefill chunk
    story: Step | None = None  # the story parked before this row, read cold
    story_cached: Step | None = None  # the same story again, from the cache


def decode_time(server: RunningServer, action: Callable[[], object]) -> tuple[float, float]:
    """(llama_decode seconds, decode steps) that `action` caused, from /metrics."""
    seconds = server.metric("llama_srb_decode_seconds_total")
    steps = server.metric("llama_srb_decode_steps_total")
    action()
    return (
        server.metric("llama_srb_decode_seconds_total") - seconds,
        server.metric("llama_srb_decode_steps_total") - steps,
    )


def decode_step(server: RunningServer, client: Client) -> float:
    """Seconds of llama_decode per step of a fresh n=8 request (32 tokens per branch)."""
    seconds, steps = decode_time(server, partial(client.complete, story(10), 8, 32))
    return seconds / steps


def prefill_chunk(server: RunningServer, client: Client, step: float) -> float:
    """Seconds of llama_decode for a 512-token chunk of a fresh prompt."""
    # Token ids: exactly one full chunk, then the last token in a step of its own.
    chunk = client.tokenize(story(PREFILL_CHUNK))[: PREFILL_CHUNK + 1]
    seconds, _ = decode_time(server, partial(client.complete, chunk, 1, 1))
    return seconds - step


def tax_row(server: RunningServer, client: Client, repeat: int) -> TaxRow:
    """The probes, best of `repeat` each (they park a few hundred cells of their own)."""
    cells, steps, chunks = [], [], []
    for _ in range(repeat):
        cells.append(server.metric("llama_srb_kv_cells_cached"))
        steps.append(decode_step(server, client))
        chunks.append(prefill_chunk(server, client, steps[-1]))
    return TaxRow(sum(cells) / repeat, min(steps), min(chunks))


def cache_tax(
    server: RunningServer, client: Client, stories: list[int], repeat: int
) -> list[TaxRow]:
    """Probe an empty cache, then park unrelated stories of `stories` tokens one by one,
    each read cold and then once more from the cache, probing after each."""
    rows = [tax_row(server, client, repeat)]
    for tokens in stories:
        text = story(words_for(client, tokens))
        cold = client.stream(f"{tokens:,}", text, 1, 1)[0]
        cached = client.stream(f"{tokens:,}", text, 1, 1)[0]
        row = tax_row(server, client, repeat)
        row.story, row.story_cached = cold, cached
        rows.append(row)
        print(f"  tax at {row.cells:.0f} cached cells done", file=sys.stderr, flush=True)
    return rows


# -- the tables ------------------------------------------------------------------------------


def print_swipes(one_n8: float, eight_n1: float, new_tokens: int) -> None:
    print(f"\nSwipes: ~512-token prompt, {new_tokens} new tokens each, ignore_eos\n")
    print("| one request, n=8 | 8 concurrent requests, n=1 | ratio |")
    print("|---:|---:|---:|")
    print(f"| {one_n8:.2f} s | {eight_n1:.2f} s | {eight_n1 / one_n8:.2f} |")


def print_walks(done: list[Walk], new_tokens: int) -> None:
    print(f"\nTree walks: n=4, {new_tokens} new tokens per branch; time to first token")
    print("(prompt tokens from the cache / prompt tokens)\n")
    print("| step | " + " | ".join(walk.heading for walk in done) + " |")
    print("|---|" + "---:|" * len(done))
    for i, first in enumerate(done[0].steps):
        steps = [walk.steps[i] for walk in done]
        cells = [f"{s.ttft:.3f} s ({s.cached:,}/{s.prompt_tokens:,})" for s in steps]
        print(f"| {first.name} | " + " | ".join(cells) + " |")


def print_writers(table: list[list[Step]], words: int, new_tokens: int) -> None:
    count = len(table[0])
    print(f"\nWriters: {count} writers, {words:,}-word stories each, taking turns (one step")
    print(f"each per turn), n=4, {new_tokens} new tokens per branch; time to first token")
    print("(share of the prompt from the cache)\n")
    print("| step | " + " | ".join(f"writer {i + 1}" for i in range(count)) + " |")
    print("|---|" + "---:|" * count)
    for steps in table:
        cells = [f"{s.ttft:.3f} s ({s.cached / s.prompt_tokens:.0%})" for s in steps]
        print(f"| {steps[0].name} | " + " | ".join(cells) + " |")
    later = [s for steps in table[1:] for s in steps]
    hit = sum(s.cached for s in later) / sum(s.prompt_tokens for s in later)
    print(f"\nsteps 2-4: {hit:.1%} of prompt tokens from the cache")


def print_tax(rows: list[TaxRow]) -> None:
    print("\nCache tax: llama_decode time per step with idle cached cells (unrelated stories),")
    print("against what a hit on the story parked last saves (time to first token)\n")
    print(
        "| idle cached cells | decode step, n=8 | vs empty | 512-token prefill chunk | vs empty "
        "| story parked last | read cold | from the cache |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = rows[0]
    for r in rows:
        parked = "– | – | –"
        if r.story is not None and r.story_cached is not None:
            parked = (
                f"{r.story.prompt_tokens:,} tokens | {r.story.ttft:.1f} s "
                f"| {r.story_cached.ttft:.3f} s"
            )
        print(
            f"| {r.cells:,.0f} | {r.decode_step * 1000:.1f} ms | "
            f"{r.decode_step / base.decode_step:.2f} | {r.prefill_chunk * 1000:.0f} ms | "
            f"{r.prefill_chunk / base.prefill_chunk:.2f} | {parked} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="swipes,walks,writers,tax")
    parser.add_argument(
        "--checkout",
        type=Path,
        help="run an older llama-srb checkout's server (a before/after sitting)",
    )
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    parser.add_argument("--n-ctx", type=int, default=None, help="default: the server's own")
    parser.add_argument("--new-tokens", type=int, default=48, help="per branch, walks/writers")
    parser.add_argument("--swipe-tokens", type=int, default=128)
    parser.add_argument("--walk-words", default="1500,3000,5000,end")
    parser.add_argument("--end-fraction", type=float, default=0.75)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--writer-words", type=int, default=3000)
    parser.add_argument("--tax-stories", default="4000,4000,6000,8000", help="tokens each")
    parser.add_argument("--tax-repeat", type=int, default=2, help="best of this many probes")
    args = parser.parse_args()
    parts = args.parts.split(",")

    printers: list[Callable[[], None]] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if "swipes" in parts:
            with server(tmp, args.model, args.n_ctx, args.checkout) as (_, client):
                one_n8, eight_n1 = swipes(client, args.swipe_tokens)
            printers.append(lambda: print_swipes(one_n8, eight_n1, args.swipe_tokens))
        if "walks" in parts:
            with server(tmp, args.model, args.n_ctx, args.checkout) as (_, client):
                sizes = args.walk_words.split(",")
                walk_tables = walks(client, sizes, args.end_fraction, args.new_tokens)
            printers.append(lambda: print_walks(walk_tables, args.new_tokens))
        if "writers" in parts:
            with server(tmp, args.model, args.n_ctx, args.checkout) as (_, client):
                turns = writers(client, args.writers, args.writer_words, args.new_tokens)
            printers.append(lambda: print_writers(turns, args.writer_words, args.new_tokens))
        if "tax" in parts:
            with server(tmp, args.model, args.n_ctx, args.checkout) as (running, client):
                stories = [int(x) for x in args.tax_stories.split(",")]
                tax = cache_tax(running, client, stories, args.tax_repeat)
            printers.append(lambda: print_tax(tax))
    for print_part in printers:
        print_part()
    print("\nreproduce:", shlex.join([".venv/bin/python", "bench/bench_cache.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()

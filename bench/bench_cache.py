"""The prefix cache, measured: swipes, a tree walk, and what idle cached cells cost.

    .venv/bin/python bench/bench_cache.py [--new-tokens 128] [--fill 0,2048,4096,6144]

1. Swipes: 8 concurrent requests with n=1 and the same ~512-token prompt vs one request
   with n=8 (each on a prompt not seen before, 128 new tokens, ignore_eos).
2. Tree walk: a ~1,500-token story, n=4 branches; continue from branch A; from A's first
   child; then back to branch B of the first round. Time to first token of each step.
3. Cache tax: decode throughput of an n=8 request (first token to last) while the cache
   holds FILL idle cells of unrelated stories, against an empty cache, same server.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.testing import RunningServer, run_server

SENTENCES = [
    "The lighthouse keeper counted the steps as he climbed, one hundred and twelve of them.",
    "Below, the sea argued with the rocks and the gulls wheeled over the harbour.",
    "Mara had kept the light for thirty years, since the winter her father's boat was lost.",
    "Every night she wrote one line in the logbook, and every morning she read it again.",
    "The village believed the lamp had a will of its own, and she never told them otherwise.",
]


def story(tokens: int) -> str:
    """A fresh story of about `tokens` tokens (a new prefix, so nothing of it is cached)."""
    words, text, i = 0, [uuid.uuid4().hex + "."], 0
    while words * 1.3 < tokens:
        sentence = SENTENCES[i % len(SENTENCES)]
        text.append(sentence)
        words += len(sentence.split())
        i += 1
    return " ".join(text)


class Client:
    def __init__(self, server: RunningServer) -> None:
        self.url = f"{server.api_url}/completions"
        self.http = httpx.Client(timeout=600)

    def complete(self, prompt: str, n: int, new_tokens: int, seed: int = 0) -> dict:
        body = {
            "prompt": prompt,
            "n": n,
            "max_tokens": new_tokens,
            "ignore_eos": True,
            "seed": seed,
        }
        response = self.http.post(self.url, json=body)
        response.raise_for_status()
        return response.json()

    def stream(self, prompt: str, n: int, new_tokens: int) -> tuple[float, float, list[str], int]:
        """(time to first token, decode seconds first→last token, texts, cached tokens)."""
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
        first = last = 0.0
        cached = 0
        with self.http.stream("POST", self.url, json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
                for choice in chunk["choices"]:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    texts[choice["index"]] += choice["text"]
        return first - started, last - first, texts, cached


def swipes(client: Client, new_tokens: int) -> tuple[float, float]:
    prompt = story(512)
    started = time.perf_counter()
    client.complete(prompt, 8, new_tokens)
    one_n8 = time.perf_counter() - started
    prompt = story(512)
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda seed: client.complete(prompt, 1, new_tokens, seed), range(8)))
    return one_n8, time.perf_counter() - started


def tree_walk(client: Client, new_tokens: int) -> list[tuple[str, float, int]]:
    root = story(1500)
    steps = []
    ttft, _, first_round, cached = client.stream(root, 4, new_tokens)
    steps.append(("story, n=4 (cold)", ttft, cached))
    branch_a = root + first_round[0]
    ttft, _, second_round, cached = client.stream(branch_a, 4, new_tokens)
    steps.append(("continue branch A, n=4", ttft, cached))
    ttft, _, _, cached = client.stream(branch_a + second_round[0], 4, new_tokens)
    steps.append(("continue A's first child, n=4", ttft, cached))
    ttft, _, _, cached = client.stream(root + first_round[1], 4, new_tokens)
    steps.append(("back to branch B, n=4", ttft, cached))
    return steps


def cache_tax(client: Client, server: RunningServer, fills: list[int], new_tokens: int) -> list:
    rows = []
    for fill in fills:
        # Park idle paths of unrelated stories until the cache holds about `fill` cells.
        while server.metric("llama_srb_kv_cells_cached") < fill - 300:
            client.complete(story(400), 1, 8)
        cells = server.metric("llama_srb_kv_cells_cached")
        _, decode_s, _, _ = client.stream(story(512), 8, new_tokens)
        rows.append((fill, cells, 8 * (new_tokens - 1) / decode_s))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--fill", default="0,2048,4096,6144")
    parser.add_argument("--n-ctx", type=int, default=8192)
    args = parser.parse_args()
    fills = [int(x) for x in args.fill.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        with run_server(Path(tmp), "--n-ctx", str(args.n_ctx)) as server:
            client = Client(server)
            client.complete("warm-up", 1, 4)
            one_n8, eight_n1 = swipes(client, args.new_tokens)
            walk = tree_walk(client, args.new_tokens)
        # The tax needs a cache budget above the largest fill, and room beside it for the
        # measured request: a server of its own.
        budget = max(fills) + 1024
        n_ctx = str(max(args.n_ctx, budget + 4096))
        with run_server(Path(tmp), "--n-ctx", n_ctx, "--cache-cells", str(budget)) as server:
            client = Client(server)
            client.complete("warm-up", 1, 4)
            tax = cache_tax(client, server, fills, args.new_tokens)

    print(f"\nSwipes: ~512-token prompt, {args.new_tokens} new tokens each, ignore_eos\n")
    print("| one request, n=8 | 8 concurrent requests, n=1 | ratio |")
    print("|---:|---:|---:|")
    print(f"| {one_n8:.2f} s | {eight_n1:.2f} s | {eight_n1 / one_n8:.2f} |")
    print(f"\nTree walk: ~1,500-token story, n=4, {args.new_tokens} new tokens per branch\n")
    print("| step | time to first token | prompt tokens from cache |")
    print("|---|---:|---:|")
    for name, ttft, cached in walk:
        print(f"| {name} | {ttft:.3f} s | {cached} |")
    print(f"\nCache tax: n=8 decode throughput with idle cached cells, {args.new_tokens} tokens\n")
    print("| idle cached cells | decode tok/s | vs empty cache |")
    print("|---:|---:|---:|")
    for _, cells, tps in tax:
        print(f"| {cells:.0f} | {tps:.1f} | {tps / tax[0][2]:.2f} |")
    print(
        f"\nreproduce: .venv/bin/python bench/bench_cache.py --new-tokens {args.new_tokens} "
        f"--fill {args.fill} --n-ctx {args.n_ctx}"
    )


if __name__ == "__main__":
    main()

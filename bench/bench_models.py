"""Models on demand: switching between the two bundled models, and a story's way back.

    .venv/bin/python bench/bench_models.py [--story-tokens 4000] [--switches 10]

One server with both bundled models and --models-max 1 (each request naming the other
model unloads the one loaded and loads it):
  1. a cold read: a story of --story-tokens tokens on Gemma 3 (nothing cached);
  2. a switch to SmolLM2 and back, --switches times: the time from a one-token request
     naming the other model to its first streamed token (unload, load, first token);
  3. one more switch to SmolLM2, then the same story on Gemma: its first token, the
     switch back included, from the disk tier (cached tokens from `usage`), against the
     cold read;
  4. the server's resident memory (VmRSS) after the first switch and after the last.
Streamed requests; times from the request's sending to its first text chunk.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.server import RunningServer, run_server

GEMMA, SMOL = "gemma-3-270m-q4_k_m", "smollm2-135m-instruct"
PARAGRAPH = (
    "The lighthouse keeper of Varrow Point kept a ledger of every ship that passed, and on "
    "the night of the great storm she wrote the names of seven, then an eighth that had no "
    "name at all, only a lantern burning green above its prow. "
)


def first_token(server: RunningServer, model: str, prompt: str) -> tuple[float, dict[str, Any]]:
    """Seconds to the first text chunk of a four-token streamed request, and its usage."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 4,  # two or more in the cells: a swipe restores its prompt (cache-tiers.md)
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first = time.monotonic(), None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{server.api_url}/completions", json=body, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.monotonic()
            usage = chunk.get("usage") or usage
    assert first is not None, "no text came back"
    return first - sent, usage


def rss_mib(server: RunningServer) -> float:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return kib / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--story-tokens", type=int, default=4000)
    parser.add_argument("--switches", type=int, default=10)
    args = parser.parse_args()
    command = "bench/bench_models.py " + shlex.join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        flags = ["--model", "gemma-3-270m", "--models", "smollm2-135m-instruct"]
        flags += ["--models-max", "1", "--n-ctx", str(args.story_tokens + 512)]
        with run_server(Path(tmp), *flags) as server:
            # about 45 Gemma tokens a paragraph
            story = PARAGRAPH * max(1, args.story_tokens // 45)
            cold, cold_usage = first_token(server, GEMMA, story)
            to_smol, to_gemma, rss = [], [], []
            for _ in range(args.switches):
                to_smol.append(first_token(server, SMOL, "Once upon a time")[0])
                to_gemma.append(first_token(server, GEMMA, "Once upon a time")[0])
                rss.append(rss_mib(server))
            first_token(server, SMOL, "Once upon a time")  # away once more: the story's
            back, back_usage = first_token(server, GEMMA, story)  # request switches back
    cached = back_usage["prompt_tokens_details"]["cached_tokens"]
    print(f"# {command}\n")
    print("| measure | value |\n|---|---:|")
    print(
        f"| switch to SmolLM2, first token (median of {args.switches}) |"
        f" {statistics.median(to_smol):.2f} s |"
    )
    print(
        f"| switch to Gemma 3, first token (median of {args.switches}) |"
        f" {statistics.median(to_gemma):.2f} s |"
    )
    print(f"| {cold_usage['prompt_tokens']:,}-token story, cold read, first token | {cold:.2f} s |")
    print(
        f"| the same story, its request switching back, first token ({cached:,} cached) |"
        f" {back:.2f} s |"
    )
    print(
        f"| server memory after 1 switch / after {args.switches} | {rss[0]:.0f} /"
        f" {rss[-1]:.0f} MiB |"
    )


if __name__ == "__main__":
    main()

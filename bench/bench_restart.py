"""Stories that outlive the process: time to first token before and after a restart, and
for a story other stories pushed out of the live cells (docs/cache-tiers.md).

    .venv/bin/python bench/bench_restart.py [--words 8000] [--n-ctx 16384]
                                            [--pushed-words 1500] [--pushers 20]
                                            [--model gemma-3-270m]

1. Restart: a story of --words words, cold (n=1, streamed); continued on the same server
   (a live hit); the server stopped and started again on the same --cache-dir; continued
   again (restored from the disk tier).
2. Pushed out: a story of --pushed-words words, cold; --pushers unrelated stories of 300
   words each read after it on a server with --n-ctx 4096, so it leaves the live cells for
   host memory; then continued (restored from host memory).

Continuations are sent as text, as clients send them: the story, the answer, a sentence
more. Each row gives the time to first token and the prompt tokens from the cache.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_cache import Client, Step, story
from llama_srb.bundled_model import DEFAULT
from tests.support.server import RunningServer, run_server

MORE = [" Then the door opened.", " Nobody answered her."]
NEW_TOKENS = 16


def restored_line(server: RunningServer) -> str:
    """The log's last word on a restore, for the table's notes."""
    lines = [line for line in server.log().splitlines() if "restored" in line]
    return re.sub(r"^.*INFO \S+: ", "", lines[-1]) if lines else "(no restore logged)"


def restart(tmp: Path, model: str, words: int, n_ctx: int) -> tuple[list[Step], list[str]]:
    cache = tmp / "kv"
    args = ("--model", model, "--n-ctx", str(n_ctx), "--cache-dir", str(cache))
    steps: list[Step] = []
    with run_server(tmp, *args) as server:
        client = Client(server)
        client.complete("warm-up", 1, 4)
        prompt = story(words)
        step, texts = client.stream("story (cold)", prompt, 1, NEW_TOKENS)
        steps.append(step)
        prompt += texts[0] + MORE[0]
        step, texts = client.stream("continued, same server (live cells)", prompt, 1, NEW_TOKENS)
        steps.append(step)
        prompt += texts[0] + MORE[1]
    with run_server(tmp, *args) as server:
        client = Client(server)
        client.complete("warm-up", 1, 4)
        step, _ = client.stream("continued after a restart (disk tier)", prompt, 1, NEW_TOKENS)
        steps.append(step)
        notes = [restored_line(server)]
    return steps, notes


def pushed_out(tmp: Path, model: str, words: int, pushers: int) -> tuple[list[Step], list[str]]:
    args = ("--model", model, "--n-ctx", "4096", "--cache-disk", "0")
    with run_server(tmp, *args) as server:
        client = Client(server)
        client.complete("warm-up", 1, 4)
        prompt = story(words)
        cold, texts = client.stream("story (cold)", prompt, 1, NEW_TOKENS)
        for _ in range(pushers):
            client.complete(story(300), 1, NEW_TOKENS)
        entries = server.metric('llama_srb_cache_tier_entries{tier="host"}')
        prompt += texts[0] + MORE[0]
        label = f"continued after {pushers} other stories (host tier)"
        step, _ = client.stream(label, prompt, 1, NEW_TOKENS)
        notes = [f"{entries:.0f} paths in host memory before it", restored_line(server)]
    return [cold, step], notes


def table(title: str, steps: list[Step], notes: list[str]) -> None:
    print(f"\n{title}\n")
    print("| step | time to first token | prompt tokens from the cache |")
    print("|---|---:|---:|")
    for step in steps:
        print(f"| {step.name} | {step.ttft:.2f} s | {step.cached:,} / {step.prompt_tokens:,} |")
    for note in notes:
        print(f"\n{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT)
    parser.add_argument("--words", type=int, default=8000)
    parser.add_argument("--n-ctx", type=int, default=16384, help="for the restart part")
    parser.add_argument("--pushed-words", type=int, default=1500)
    parser.add_argument("--pushers", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        steps, notes = restart(Path(tmp), args.model, args.words, args.n_ctx)
        table(f"Restart: a {args.words:,}-word story, n=1, {NEW_TOKENS} new tokens", steps, notes)
    with tempfile.TemporaryDirectory() as tmp:
        steps, notes = pushed_out(Path(tmp), args.model, args.pushed_words, args.pushers)
        title = f"Pushed out: a {args.pushed_words:,}-word story, then {args.pushers} others"
        table(title, steps, notes)
    print("\nreproduce:", shlex.join([".venv/bin/python", "bench/bench_restart.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()

"""What streaming costs: one request with n branches, streamed (one SSE chunk per choice per
token, as SillyTavern reads them) or not.

    .venv/bin/python bench/bench_stream.py [--ns 16] [--prompt-tokens 256]
                                           [--new-tokens 128] [--repeat 3]
                                           [--server-args "--threads 1"]

Two tables. **End to end**: the three modes side by side on one server, every generation
with `ignore_eos` (each branch makes exactly --new-tokens tokens); wall seconds from
sending to the last byte, the client reading every event, and the server process's CPU
seconds (all threads, from /proc); tok/s counts the tokens of all branches. Runs
alternate between the modes after a warm-up of each; each cell is the best of --repeat.
Prompts start with a fresh tag, so the prefix cache never helps one mode over another.
**The API layer alone**: the same outputs (n branches, --new-tokens steps) made up and
pushed through each mode's formatting in this process, without a model: what streaming
adds per decode step, against the server's mean decode step from the first table. On a
shared machine the first table moves with everyone else's load; the second does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.api.input.prompts import Prompt
from llama_srb.api.render.completions import CompletionAnswer
from llama_srb.api.render.native import NativeCall, NativeOptions
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput, RequestTimes
from llama_srb.engine.request import FinishReason
from llama_srb.sampling.params import SamplingParams
from tests.support.server import RunningServer, run_server

PARAGRAPH = (
    "The lighthouse stood at the edge of the world, and every night its keeper climbed the "
    "hundred and twelve steps to light the lamp. The sea below was never quiet; it argued "
    "with the rocks, it whispered to the gulls, and sometimes, in the hour before dawn, it "
    "sang. "
)

Mode = Callable[[httpx.Client, str, str, int, int], int]  # returns the events read


def non_streamed(client: httpx.Client, url: str, text: str, n: int, new: int) -> int:
    body = {"prompt": fresh(text), "n": n, "max_tokens": new, "ignore_eos": True, "seed": 1}
    response = client.post(f"{url}/v1/completions", json=body)
    response.raise_for_status()
    assert len(response.json()["choices"]) == n
    return 0


def streamed(client: httpx.Client, url: str, text: str, n: int, new: int) -> int:
    body = {"prompt": fresh(text), "n": n, "max_tokens": new, "ignore_eos": True, "seed": 1}
    return _read_events(client, f"{url}/v1/completions", {**body, "stream": True})


def native_streamed(client: httpx.Client, url: str, text: str, n: int, new: int) -> int:
    body = {"prompt": fresh(text), "n": n, "n_predict": new, "ignore_eos": True, "stream": True}
    return _read_events(client, f"{url}/completion", body)


def _read_events(client: httpx.Client, url: str, body: dict[str, object]) -> int:
    events = 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            events += line.startswith("data: ")
    return events


MODES: dict[str, Mode] = {
    "non-streamed /v1/completions": non_streamed,
    "streamed /v1/completions": streamed,
    "streamed /completion (llama.cpp)": native_streamed,
}


def fresh(text: str) -> str:
    """The prompt under a tag never seen before: no mode gets the prefix cache's help."""
    return f"Draft {uuid.uuid4().hex[:8]}. {text}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads included (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Best:
    wall: float  # seconds, the best run's
    cpu: float  # the server's CPU seconds, the best run's
    events: int


def end_to_end(server: RunningServer, text: str, n: int, args: argparse.Namespace) -> dict:
    client = httpx.Client(timeout=1800)
    best: dict[str, Best] = {}
    for mode in MODES.values():  # warm-up: llama.cpp sizes its buffers for n
        mode(client, server.base_url, text, n, 4)
    for _ in range(args.repeat):
        for name, mode in MODES.items():
            cpu, started = cpu_seconds(server.process.pid), time.perf_counter()
            events = mode(client, server.base_url, text, n, args.new_tokens)
            seconds = time.perf_counter() - started
            cpu = cpu_seconds(server.process.pid) - cpu
            old = best.get(name, Best(float("inf"), float("inf"), events))
            best[name] = Best(min(old.wall, seconds), min(old.cpu, cpu), events)
    return best


# -- the API layer alone ---------------------------------------------------------------------


class WordVocab:
    """Every token spells " word" (as native.Model's piece and text would)."""

    def piece(self, token: int) -> bytes:
        return b" word"

    def text(self, tokens: Sequence[int]) -> str:
        return " word" * len(tokens)


def made_up_outputs(n: int, steps: int) -> list[RequestOutput]:
    """What the engine hands one request with n branches: one token per branch per step."""
    outputs = []
    for step in range(steps):
        last = step == steps - 1
        reason = FinishReason.LENGTH if last else None
        choices = [ChoiceDelta(i, " word", [1234], reason) for i in range(n)]
        outputs.append(
            RequestOutput(
                "cmpl-x", choices, n, 256, n * (step + 1), RequestTimes(0.0), finished=last
            )
        )
    return outputs


async def _feed(outputs: list[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    for out in outputs:
        yield 0, out


async def _drain(events: AsyncIterator[str]) -> None:
    async for event in events:
        event.encode()  # what the transport does with it


def api_costs(n: int, steps: int, repeat: int) -> dict[str, float]:
    """Seconds each mode's formatting takes for the whole request (best of `repeat`)."""
    prompts = [Prompt([2] * 256, "x" * 1000)]
    answer = CompletionAnswer("cmpl-x", 0, "m", False, n, None, prompts=prompts)

    async def plain(outputs: list[RequestOutput]) -> None:
        json.dumps(await answer.collect(_feed(outputs)))

    async def openai_stream(outputs: list[RequestOutput]) -> None:
        await _drain(answer.events(_feed(outputs)))

    async def native_stream(outputs: list[RequestOutput]) -> None:
        options = NativeOptions("m", n, stream=True)
        call = NativeCall(options, SamplingParams(), prompts, WordVocab())
        await _drain(call.events(_feed(outputs)))

    runs: dict[str, Callable[[list[RequestOutput]], Coroutine[None, None, None]]] = dict(
        zip(MODES, (plain, openai_stream, native_stream), strict=True)
    )
    costs: dict[str, float] = {}
    for name, run in runs.items():
        times = []
        for _ in range(repeat):
            outputs = made_up_outputs(n, steps)
            started = time.perf_counter()
            asyncio.run(run(outputs))
            times.append(time.perf_counter() - started)
        costs[name] = min(times)
    return costs


def decode_step_seconds(server: RunningServer) -> float:
    metrics = server.metrics()
    return metrics["llama_srb_decode_seconds_total"] / metrics["llama_srb_decode_steps_total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ns", default="16")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server-args", default="", help="extra `llama-srb serve` flags")
    args = parser.parse_args()
    text = PARAGRAPH * max(1, args.prompt_tokens // 60)  # ~60 tokens a paragraph
    ns = [int(x) for x in args.ns.split(",")]

    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), *args.server_args.split()) as server,
    ):
        for n in ns:
            rows.append((n, end_to_end(server, text, n, args)))
            print(f"  n={n} done", file=sys.stderr, flush=True)
        step = decode_step_seconds(server)
    costs = [(n, api_costs(n, args.new_tokens, 5)) for n in ns]
    print_tables(rows, costs, step, args)


def print_tables(
    rows: list[tuple[int, dict[str, Best]]],
    costs: list[tuple[int, dict[str, float]]],
    step: float,
    args: argparse.Namespace,
) -> None:
    new, names = args.new_tokens, list(MODES)
    print(
        f"\nEnd to end: ~{args.prompt_tokens}-token prompt, {new} new tokens per branch,"
        f" ignore_eos; best of {args.repeat}; wall seconds (generated tok/s), server CPU"
        " seconds [SSE events]\n"
    )
    print(f"| n | {' | '.join(names)} | streamed / non-streamed: tok/s, tok/CPU-s |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for n, best in rows:
        cells = []
        for name in names:
            b = best[name]
            extra = f" [{b.events}]" if b.events else ""
            cells.append(f"{b.wall:.2f} s ({n * new / b.wall:.0f}), {b.cpu:.2f} s CPU{extra}")
        plain, streamed = best[names[0]], best[names[1]]
        ratios = f"{plain.wall / streamed.wall:.3f}, {plain.cpu / streamed.cpu:.3f}"
        print(f"| {n} | {' | '.join(cells)} | {ratios} |")
    print(
        f"\nThe API layer alone: {new} steps of n made-up tokens through each mode's"
        f" formatting, per decode step (best of 5); the server's mean decode step above:"
        f" {step * 1000:.1f} ms\n"
    )
    print(f"| n | {' | '.join(names)} | streaming adds, per decode step |")
    print("|---:|" + "---:|" * (len(names) + 1))
    for n, cost in costs:
        cells = [f"{cost[name] / new * 1e6:.0f} µs" for name in names]
        added = (cost[names[1]] - cost[names[0]]) / new
        share = f"{added * 1e6:.0f} µs ({added / step:.2%} of a step)"
        print(f"| {n} | {' | '.join(cells)} | {share} |")
    print(
        f"\nreproduce: .venv/bin/python bench/bench_stream.py --ns {args.ns}"
        f" --prompt-tokens {args.prompt_tokens} --new-tokens {new} --repeat {args.repeat}"
        + (f' --server-args "{args.server_args}"' if args.server_args else "")
    )


if __name__ == "__main__":
    main()

"""End to end, ours beside llama.cpp's llama-server on identical request bodies, in one run.

    .venv/bin/python bench/bench_vs_llama.py [--ns 1,8,32,64] [--prompt-tokens 512]
                                             [--new-tokens 64] [--st-n 8] [--repeat 1]
                                             [--model gemma-3-270m] [--llama-tools DIR]
                                             [--server-args "..."] [--before DIR]

Servers, one at a time, each sent the same bodies:
  - llama-srb on its default settings (tests.support.server.run_server);
  - llama-server -np <largest n> with our context's shape: -c, -t, -b, -ub, -kvu,
    --swa-full (bench/llama_tools.py);
  - the same with backend sampling (-bs): the leading samplers of each chain that llama.cpp
    can run inside llama_decode's graph (a disabled one counts as such) run there.
  - with --before DIR: our server as an older checkout of llama-srb (a git worktree) has it,
    first, so that before and after meet the same machine in one sitting.
Bodies:
  - n = each of --ns: /v1/completions {prompt, n, max_tokens, ignore_eos, seed}. Both servers
    carry the n completions in one request (llama-server's `n` is its n_cmpl: child slots
    that copy the prompt's cells once it is decoded; tools/server/server-context.cpp);
  - SillyTavern 1.19.0's default settings as its llama.cpp type sends them to /completion
    (its own request builder: bench/presets.py), --st-n swipes, with ignore_eos set so that
    every branch runs --new-tokens; and the same body with top_k 40.
Each prompt is about --prompt-tokens tokens under a fresh tag (bench_batching.py), the same
on every server, so no prefix cache helps. Wall seconds from sending to the last byte,
prefill included; tok/s counts generated tokens of all branches; best of --repeat. For ours,
from /metrics over each request: host ms per step (`llama_srb_host_step_seconds`: a step's
time outside llama_decode), the same per branch, and (wall - llama_decode) per step, which
also counts the request's HTTP and parsing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_batching import fresh, make_prompt
from bench.llama_tools import TOOLS, EngineClock, Shape, llama_server
from bench.presets import Body, sillytavern_request
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.loader import model_options
from llama_srb.native import Model
from tests.support.server import RunningServer, run_server

ST_STOP = ["\nUser:"]  # SillyTavern always sends its stop strings; this one never comes here
TIMEOUT = httpx.Timeout(1800)


@dataclass(frozen=True)
class Case:
    name: str
    path: str  # under the server's base URL
    n: int
    bodies: tuple[Body, ...]  # one per repeat, each with its own fresh prompt

    def nth(self, repeat: int) -> Case:
        """The case with its `repeat`-th body alone."""
        return Case(self.name, self.path, self.n, (self.bodies[repeat],))


@dataclass(frozen=True)
class Cell:
    seconds: float
    tokens: int  # generated, all branches
    clock: EngineClock | None  # ours only: the engine's time over the request

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    def host_ms(self, n: int) -> tuple[float, float, float]:
        """Host ms per step, per branch per step, and (wall - llama_decode) ms per step."""
        assert self.clock is not None
        steps = self.clock.steps
        host = self.clock.host_seconds / steps * 1e3
        outside = (self.seconds - self.clock.decode_seconds) / steps * 1e3
        return host, host / n, outside


def generated(case: Case, body: Body, answer: Any) -> int:
    """Generated tokens, checked: n branches, each run to its length (ignore_eos)."""
    if case.path == "/v1/completions":  # llama-server's usage counts one choice: count them
        choices = answer["choices"]
        assert len(choices) == case.n, answer
        assert all(c["finish_reason"] == "length" for c in choices), answer
        return case.n * int(body["max_tokens"])
    results = answer if isinstance(answer, list) else [answer]
    assert len(results) == case.n, answer
    return sum(int(r["tokens_predicted"]) for r in results)


def send(http: httpx.Client, base: str, case: Case, body: Body, ours: RunningServer | None) -> Cell:
    before = EngineClock.read(ours) if ours else None
    started = time.perf_counter()
    response = http.post(base + case.path, json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    clock = EngineClock.read(ours) - before if ours and before else None
    return Cell(seconds, generated(case, body, response.json()), clock)


def run_cases(base: str, cases: list[Case], ours: RunningServer | None = None) -> list[Cell]:
    """Each case's best of its bodies, after a warm-up request."""
    return [cell for cell in tried_cases(base, cases, ours, refusals=False) if cell is not None]


def tried_cases(
    base: str, cases: list[Case], ours: RunningServer | None, refusals: bool
) -> list[Cell | None]:
    """run_cases; with `refusals`, a case the server answers with a 4xx is None (an older
    llama-srb refused SillyTavern's sampler names)."""
    with httpx.Client(timeout=TIMEOUT) as http:
        warm = {"prompt": fresh("Once upon a time"), "max_tokens": 8, "ignore_eos": True}
        http.post(f"{base}/v1/completions", json=warm).raise_for_status()
        cells: list[Cell | None] = []
        for case in cases:
            try:
                tries = [send(http, base, case, body, ours) for body in case.bodies]
            except httpx.HTTPStatusError as exc:
                if not (refusals and exc.response.is_client_error):
                    raise
                cells.append(None)
                print(f"  {case.name}: refused, {exc.response.text[:200]}", file=sys.stderr)
                continue
            cells.append(min(tries, key=lambda cell: cell.seconds))
            print(f"  {case.name}: {tries[0].seconds:.2f} s", file=sys.stderr, flush=True)
    return cells


def completion_cases(prompt: str, ns: list[int], new_tokens: int, repeat: int) -> list[Case]:
    def body(n: int, seed: int) -> Body:
        return {
            "prompt": fresh(prompt),
            "n": n,
            "max_tokens": new_tokens,
            "ignore_eos": True,
            "seed": seed,
        }

    return [
        Case(f"n={n}", "/v1/completions", n, tuple(body(n, i) for i in range(repeat))) for n in ns
    ]


def sillytavern_cases(prompt: str, n: int, new_tokens: int, repeat: int) -> list[Case]:
    """SillyTavern's body as it ships, and the same with top_k 40 (the issue's comparison)."""
    shipped = sillytavern_request(prompt, n, new_tokens, ST_STOP)

    def body(**change: Any) -> Body:
        return {**shipped, "prompt": fresh(prompt), "ignore_eos": True, **change}

    return [
        Case(
            f"SillyTavern defaults (top_k {shipped['top_k']}), n={n}",
            "/completion",
            n,
            tuple(body() for _ in range(repeat)),
        ),
        Case(
            f"same, top_k 40, n={n}",
            "/completion",
            n,
            tuple(body(top_k=40) for _ in range(repeat)),
        ),
    ]


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="1,8,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--st-n", type=int, default=8, help="SillyTavern's swipes (n)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    parser.add_argument("--llama-tools", type=Path, default=TOOLS, help="llama.cpp's bin/")
    parser.add_argument("--server-args", default="", help="ours beyond its defaults")
    parser.add_argument("--before", type=Path, help="an older llama-srb checkout, run too")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    started_load = load()

    model_path = Settings(model=args.model).resolved_model_path()
    model = Model(model_path, model_options(Settings(model=args.model)))
    prompt = make_prompt(model, args.prompt_tokens)
    prompt_len = len(model.tokenize(fresh(prompt)))
    model.close()
    cases = completion_cases(prompt, ns, args.new_tokens, args.repeat)
    cases += sillytavern_cases(prompt, args.st_n, args.new_tokens, args.repeat)

    server_args = ("--model", args.model, *shlex.split(args.server_args))  # else defaults
    with tempfile.TemporaryDirectory() as tmp:
        before: list[Cell | None] = []
        if args.before is not None:
            with run_server(Path(tmp), *server_args, checkout=args.before.resolve()) as server:
                before = tried_cases(server.base_url, cases, server, refusals=True)
        with run_server(Path(tmp), *server_args) as server:
            ours = run_cases(server.base_url, cases, server)
            shape = Shape(n_ctx=int(server.metric("llama_srb_kv_cells_total")))
        slots = max(*ns, args.st_n)
        theirs = {}
        for name, extra in {"llama-server": (), "llama-server -bs": ("-bs",)}.items():
            with llama_server(args.llama_tools, model_path, shape, slots, Path(tmp), *extra) as b:
                theirs[name] = run_cases(b, cases)

    print(
        f"\n{args.model}: prompt {prompt_len} tokens, {args.new_tokens} new tokens per branch,"
        f" ignore_eos; best of {args.repeat}; generated tok/s (wall seconds)"
    )
    print(f"llama-server: -np {slots} {' '.join(shape.args())}")
    print(f"{started_load} at the start, {load()} at the end\n")
    print(
        "| body | llama-srb | llama-server | llama-server -bs | ours / llama-server"
        " | ours: host ms per step | per branch | wall − decode ms per step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, case in enumerate(cases):
        row = [ours[i], theirs["llama-server"][i], theirs["llama-server -bs"][i]]
        speeds = " | ".join(f"{c.tok_s:.0f} ({c.seconds:.2f} s)" for c in row)
        host, branch, outside = ours[i].host_ms(case.n)
        print(
            f"| {case.name} | {speeds} | {row[0].tok_s / row[1].tok_s:.2f}"
            f" | {host:.1f} | {branch:.2f} | {outside:.1f} |"
        )
    if before:
        print("\nBefore (--before) and after, our server alone; wall − llama_decode per step:\n")
        print("| body | before tok/s | after tok/s | before ms per branch | after ms per branch |")
        print("|---|---:|---:|---:|---:|")
        for case, old, new in zip(cases, before, ours, strict=True):
            then = (
                f"{old.tok_s:.0f} | {new.tok_s:.0f} | {old.host_ms(case.n)[2] / case.n:.2f}"
                if old is not None
                else f"refused | {new.tok_s:.0f} | –"
            )
            print(f"| {case.name} | {then} | {new.host_ms(case.n)[2] / case.n:.2f} |")
    shipped, topk40 = cases[-2:], ours[-2:]
    print(
        f"\nSillyTavern's body / the same with top_k 40 (ours, wall): "
        f"{topk40[0].seconds / topk40[1].seconds:.2f}× (issue 24's bound: 1.3×;"
        f" {shipped[0].name})"
    )
    command = [".venv/bin/python bench/bench_vs_llama.py", *map(shlex.quote, sys.argv[1:])]
    print(f"reproduce: {' '.join(command)}")


if __name__ == "__main__":
    main()

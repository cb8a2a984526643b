"""End to end against decode alone: one request of n branches on our server beside
llama.cpp's llama-batched-bench with the same shape, which decodes and never samples.

    .venv/bin/python bench/bench_decode_only.py [--ns 64] [--prompt-tokens 512]
                                                [--new-tokens 32] [--st-n 8] [--repeat 1]
                                                [--model gemma-3-270m] [--llama-tools DIR]
                                                [--server-args "..."]

  1. For each n of --ns: one /v1/completions request, n x --new-tokens (ignore_eos), on a
     prompt of about --prompt-tokens tokens under a fresh tag, to our server on its default
     settings; wall seconds from sending to the last byte. After each round of ours,
     llama-batched-bench -npp <the same prompt length> -ntg --new-tokens -npl <ns> -pps -kvu
     with our context's -c, -b, -ub, threads and --swa-full (bench/llama_tools.py): the
     shared prompt decoded once, then --new-tokens steps of n random tokens (T s, its prompt
     and its steps). Ours makes one decode step fewer (its first token is sampled from the
     prompt's logits, its last is never decoded), which favours ours by about 1 / --new-tokens.
  2. SillyTavern 1.19.0's default-settings body (its own request builder, bench/presets.py;
     top_k 0, its samplers order), --st-n swipes x --new-tokens, against the same body with
     top_k 40, on the same server.
With --repeat R, R rounds of both in turn, so that the machine's drift meets both; each cell
is the best of R. Prints both tables, the ratios with issue 24's bounds (n=64 within 1.10x of decode alone;
SillyTavern's body within 1.3x of top_k 40), and the command.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_batching import fresh, make_prompt
from bench.bench_vs_llama import Case, Cell, completion_cases, load, run_cases, sillytavern_cases
from bench.llama_tools import TOOLS, DecodeOnly, Shape, batched_bench
from llama_srb.bundled_model import DEFAULT
from llama_srb.config import Settings
from llama_srb.loader import model_options
from llama_srb.native import Model
from tests.support.server import run_server

DECODE_BOUND = 1.10  # issue 24: one request n=64 x 32 tokens against llama-batched-bench
ST_BOUND = 1.3  # issue 24: SillyTavern's preset body against the same with top_k 40


def measured_prompt(model_name: str, tokens: int) -> tuple[Path, str, int]:
    """The model's file, a prompt of about `tokens` tokens, and its length under a fresh tag."""
    settings = Settings(model=model_name)
    path = settings.resolved_model_path()
    model = Model(path, model_options(settings))
    prompt = make_prompt(model, tokens)
    prompt_len = len(model.tokenize(fresh(prompt)))
    model.close()
    return path, prompt, prompt_len


def print_decode_table(cases: list[Case], ours: list[Cell], floor: dict[int, DecodeOnly]) -> None:
    """One row per n: ours against llama-batched-bench's decode alone."""
    print(
        "| n | llama-srb, one request | llama-batched-bench: prompt + steps = decode only"
        " | ratio | ours: llama_decode | host ms per step | per branch"
        " | wall − decode ms per step |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case, cell in zip(cases, ours, strict=True):
        assert cell.clock is not None
        decode = floor[case.n]
        host, branch, outside = cell.host_ms(case.n)
        print(
            f"| {case.n} | {cell.seconds:.2f} s | {decode.prompt:.2f} + {decode.steps:.2f}"
            f" = {decode.total:.2f} s | **{cell.seconds / decode.total:.2f}×**"
            f" | {cell.clock.decode_seconds:.2f} s"
            f" | {host:.1f} | {branch:.2f} | {outside:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", default="64")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--st-n", type=int, default=8, help="SillyTavern's swipes (n)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--model", default=DEFAULT, help="a bundled model's name or a GGUF file")
    parser.add_argument("--llama-tools", type=Path, default=TOOLS, help="llama.cpp's bin/")
    parser.add_argument("--server-args", default="", help="ours beyond its defaults")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    started_load = load()

    path, prompt, prompt_len = measured_prompt(args.model, args.prompt_tokens)
    cases = completion_cases(prompt, ns, args.new_tokens, args.repeat)
    st_cases = sillytavern_cases(prompt, args.st_n, args.new_tokens, args.repeat)

    rounds = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(
            Path(tmp), "--model", args.model, *shlex.split(args.server_args)
        ) as server,  # its default settings
    ):
        shape = Shape(n_ctx=int(server.metric("llama_srb_kv_cells_total")))
        for r in range(args.repeat):  # in turn, so that the machine's drift meets both
            got = run_cases(server.base_url, [c.nth(r) for c in cases + st_cases], server)
            rounds.append(
                (got, batched_bench(args.llama_tools, path, shape, prompt_len, args.new_tokens, ns))
            )
    cells = [
        min((got[i] for got, _ in rounds), key=lambda c: c.seconds)
        for i in range(len(cases + st_cases))
    ]
    floor = {n: min((bench[n] for _, bench in rounds), key=lambda d: d.total) for n in ns}

    print(
        f"\n{args.model}: prompt {prompt_len} tokens, {args.new_tokens} new tokens per branch,"
        f" ignore_eos; best of {args.repeat}; {started_load} at the start, {load()} at the end"
    )
    print(f"llama-batched-bench: -pps {' '.join(shape.args())}\n")
    ours, st = cells[: len(cases)], cells[len(cases) :]
    print_decode_table(cases, ours, floor)
    print("\n| body (ours) | wall | host ms per step | per branch | wall − decode ms per step |")
    print("|---|---:|---:|---:|---:|")
    for case, cell in zip(st_cases, st, strict=True):
        host, branch, outside = cell.host_ms(case.n)
        print(f"| {case.name} | {cell.seconds:.2f} s | {host:.1f} | {branch:.2f} | {outside:.1f} |")
    print()
    if 64 in floor:
        ratio = ours[ns.index(64)].seconds / floor[64].total
        verdict = "holds" if ratio <= DECODE_BOUND else "FAILS"
        print(f"n=64 against decode alone: {ratio:.2f}× (bound {DECODE_BOUND}×: {verdict})")
    ratio = st[0].seconds / st[1].seconds
    verdict = "holds" if ratio <= ST_BOUND else "FAILS"
    print(f"SillyTavern's body against top_k 40: {ratio:.2f}× (bound {ST_BOUND}×: {verdict})")
    command = [".venv/bin/python bench/bench_decode_only.py", *map(shlex.quote, sys.argv[1:])]
    print(f"reproduce: {' '.join(command)}")


if __name__ == "__main__":
    main()

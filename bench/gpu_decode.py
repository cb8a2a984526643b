"""One request of n branches against decode alone, for the GPU run (bench/gpu.sh): the first
table of bench_decode_only.py, without its SillyTavern part (which needs node and
SillyTavern's npm package, which do not travel to the GPU machine).

    python bench/gpu_decode.py --model MODEL.gguf --llama-tools BUILD/bin
                               [--ns 1,8,32,64] [--prompt-tokens 512] [--new-tokens 32]

For each n: one /v1/completions request, n x --new-tokens (ignore_eos), on a fresh prompt
of about --prompt-tokens tokens, to our server on its default settings; then
llama-batched-bench -pps -kvu with the same prompt length, steps, context, batch and threads
(bench/llama_tools.py). Prints a markdown table: ours, decode alone, their ratio, and the
host time per step and per branch-step.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_decode_only import measured_prompt, print_decode_table
from bench.bench_vs_llama import completion_cases, load, run_cases
from bench.llama_tools import Shape, batched_bench
from tests.support.server import run_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--llama-tools", type=Path, required=True, help="llama.cpp's bin/")
    parser.add_argument("--ns", default="1,8,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--server-args", default="", help="ours beyond its defaults")
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    started_load = load()

    path, prompt, prompt_len = measured_prompt(args.model, args.prompt_tokens)
    cases = completion_cases(prompt, ns, args.new_tokens, 1)
    with (
        tempfile.TemporaryDirectory() as tmp,
        run_server(Path(tmp), "--model", args.model, *shlex.split(args.server_args)) as server,
    ):
        shape = Shape(n_ctx=int(server.metric("llama_srb_kv_cells_total")))
        ours = run_cases(server.base_url, [c.nth(0) for c in cases], server)
    # After ours has stopped: the two never share the GPU's memory.
    floor = batched_bench(args.llama_tools, path, shape, prompt_len, args.new_tokens, ns)

    print(
        f"\n{Path(args.model).name}: prompt {prompt_len} tokens, {args.new_tokens} new tokens"
        f" per branch, ignore_eos; {started_load} at the start, {load()} at the end"
    )
    print(f"llama-batched-bench: -pps {' '.join(shape.args())}\n")
    print_decode_table(cases, ours, floor)
    command = ["bench/gpu_decode.py", *map(shlex.quote, sys.argv[1:])]
    print(f"\nreproduce: python {' '.join(command)}")


if __name__ == "__main__":
    main()

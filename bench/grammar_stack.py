"""How much thread stack llama.cpp's recursive grammar code needs, at the grammar limits.

    .venv/bin/python bench/grammar_stack.py [--stacks 1,8,16,64]

Each worst case the limits of `sampling/grammar.py` let through (deepest nesting, largest
repetition, nested repetitions, the longest chain of rule references) is parsed, applied
to the whole vocabulary and fed tokens, in a child process whose worker thread has the
given stack (MiB). A crash (stack overflow) shows as `died`; the size that passes every
case, with a wide margin, is what engine/native.py NATIVE_STACK_BYTES gives the engine
thread and the request workers.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llama_srb.sampling.grammar import (
    MAX_GRAMMAR_CHARS,
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_REPEAT,
    MAX_GRAMMAR_REPEATS,
    check_grammar,
)


def cases() -> dict[str, str]:
    depth = MAX_GRAMMAR_DEPTH
    chain_rules = MAX_GRAMMAR_CHARS // 16
    chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(chain_rules))
    chain += f'r{chain_rules} ::= "a"\n'
    repeats = MAX_GRAMMAR_REPEATS // MAX_GRAMMAR_REPEAT
    return {
        f"{depth} nested groups": "root ::= " + "(" * depth + '"a"' + ")" * depth,
        f'{repeats} × "a"{{0,{MAX_GRAMMAR_REPEAT}}}': "root ::= "
        + f'"a"{{0,{MAX_GRAMMAR_REPEAT}}} ' * repeats,
        f"{chain_rules} chained rules": chain,
    }


CHILD = """
import ctypes, sys, threading, time
import numpy as np
import llama_cpp as C
from llama_srb.native import Model
from llama_srb.config import Settings
from llama_srb.sampling.grammar import TOKEN_DATA

grammar_text, stack_mib = sys.stdin.read(), int(sys.argv[1])
model = Model(Settings().resolved_model_path())
a = model.tokenize("a", add_special=False, parse_special=False)[0]

def run():
    started = time.perf_counter()
    g = C.llama_sampler_init_grammar(model.vocab, grammar_text.encode(), b"root")
    assert g, "did not parse"
    for _ in range(8):
        data = np.zeros(model.n_vocab, TOKEN_DATA)
        data["id"] = np.arange(model.n_vocab)
        arr = C.llama_token_data_array(data=data.ctypes.data_as(C.llama_token_data_p),
                                       size=model.n_vocab, selected=-1, sorted=False)
        C.llama_sampler_apply(g, ctypes.byref(arr))
        if not np.isfinite(data["logit"][a]):
            break
        C.llama_sampler_accept(g, a)
    print(f"{time.perf_counter() - started:.2f}")

threading.stack_size(stack_mib << 20)
t = threading.Thread(target=run)
t.start()
t.join()
"""


def trial(grammar: str, stack_mib: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(stack_mib)],
        input=grammar,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return f"died ({done.returncode})"
    if not done.stdout.strip():
        return "failed: " + done.stderr.strip().splitlines()[-1][:80]
    return f"ok, {done.stdout.strip().splitlines()[-1]} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default="1,8,64", help="thread stack sizes to try, MiB")
    args = parser.parse_args()
    stacks = [int(s) for s in args.stacks.split(",")]
    print(f"command: .venv/bin/python bench/grammar_stack.py --stacks {args.stacks}\n")
    print("| grammar (at the limits) | chars | " + " | ".join(f"{s} MiB stack" for s in stacks))
    print("|---|---:|" + "---|" * len(stacks))
    for name, grammar in cases().items():
        check_grammar(grammar)  # the case must be one the server accepts
        cells = [trial(grammar, s) for s in stacks]
        print(f"| {name} | {len(grammar)} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()

"""The inputs that held llama.cpp's grammar sampler for seconds to minutes (issue 28; the
README's old Known limits): for the tests and bench/bench_constrained.py."""

from __future__ import annotations

from typing import Any


def chain(rules: int) -> str:
    """`r0 ::= "w0" | r1`, ... (1,600 rules: 64 KiB of grammar)."""
    body = "".join(f'r{i} ::= "w{i}" | r{i + 1}\n' for i in range(rules))
    return f'root ::= r0\n{body}r{rules} ::= "end"\n'


N = 64  # the server's --max-n (its default)
# fields, the letter biased, what a complete text is, and max_tokens: enough for the
# pattern's branches to reach llguidance's limit (~30 a's), few for the rest (a step of 64
# branches is ~0.5 s of decoding on 2 cores with Gemma 3, grammar or not).
PATHOLOGICAL: dict[str, tuple[dict[str, Any], str, str, int]] = {
    "1,600 chained alternatives": ({"grammar": chain(1600)}, "w", r"w[0-9]+|end", 8),
    "950 chained alternatives": ({"grammar": chain(950)}, "w", r"w[0-9]+|end", 8),
    'root ::= ("a"|"a")*': ({"grammar": 'root ::= ("a"|"a")*'}, "a", r"a*", 12),
    "pattern ^((a{0,100}){0,100}){0,100}$": (
        {"json_schema": {"type": "string", "pattern": "^((a{0,100}){0,100}){0,100}$"}},
        "a",
        r'"a*"',
        48,
    ),
}

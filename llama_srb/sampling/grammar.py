"""What a GBNF grammar may be: bounds on its text, checked before it is converted.

The converter (sampling/gbnf.py) writes `x{m,n}` out as n items and each nested group as a
rule of its own, and llguidance compiles chains of rules recursively on the request
workers' 64 MiB stacks (native.py): these bounds keep every grammar accepted small and
shallow enough for both (4,096 nested groups compile there; 8 MiB is not enough).
"""

from __future__ import annotations

from llama_srb.sampling.errors import ParamError

MAX_GRAMMAR_CHARS = 64 * 1024
MAX_GRAMMAR_DEPTH = 4096  # nested ( ) groups
MAX_GRAMMAR_REPEAT = 1024  # each bound of `{m,n}`
MAX_GRAMMAR_REPEATS = 4096  # all of them together


def check_grammar(text: str) -> None:
    """ParamError unless `text` is within the bounds above (strings, character classes
    and comments skipped, as llama.cpp's parser reads them)."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ParamError(
            "grammar", f"the grammar is {len(text)} characters long; at most {MAX_GRAMMAR_CHARS}"
        )
    depth = deepest = repeats = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "[":
            i = _skip_quoted(text, i, '"' if c == '"' else "]")
            continue
        if c == "#":  # a comment ends at a line break, \r included, as llama.cpp reads it
            ends = [e for e in (text.find("\n", i), text.find("\r", i)) if e >= 0]
            i = min(ends, default=n)
            continue
        if c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        elif c == "{":
            end = text.find("}", i)
            repeats += _repeat_bound(text[i + 1 : n if end < 0 else end])
        i += 1
    if deepest > MAX_GRAMMAR_DEPTH:
        raise ParamError(
            "grammar", f"the grammar nests {deepest} groups deep; at most {MAX_GRAMMAR_DEPTH}"
        )
    if repeats > MAX_GRAMMAR_REPEATS:
        raise ParamError(
            "grammar",
            f"the grammar's repetitions {{m,n}} add up to {repeats} items;"
            f" at most {MAX_GRAMMAR_REPEATS}",
        )


def _skip_quoted(text: str, start: int, close: str) -> int:
    """The index after the literal or class opened at `start` (backslash escapes skipped)."""
    i = start + 1
    while i < len(text) and text[i] != close:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _repeat_bound(inner: str) -> int:
    """The largest bound of one `{m,n}`; ParamError past MAX_GRAMMAR_REPEAT."""
    bounds = [int(b) for b in (part.strip() for part in inner.split(",")) if b.isdigit()]
    largest = max(bounds, default=0)
    if largest > MAX_GRAMMAR_REPEAT:
        raise ParamError(
            "grammar",
            f"the grammar repeats an item {largest} times ({{{inner.strip()}}});"
            f" at most {MAX_GRAMMAR_REPEAT}",
        )
    return largest

"""Grammar-constrained sampling (GBNF, JSON, JSON schemas) through llama.cpp's grammar sampler.

Running the grammar over the whole vocabulary costs about 100 ms a token with a 262k
vocabulary (Gemma 3), while checking one token is nearly free. So a branch first samples
freely and asks the grammar about that one token; only when the grammar rejects it are
candidates filtered and sampled again, as llama.cpp's own common sampler does: first the
1,024 most likely tokens, the whole vocabulary only when the grammar allows none of them.
"""

from __future__ import annotations

import ctypes
import functools
import math

import llama_cpp as C
import numpy as np
import numpy.typing as npt

from llama_srb.native import Model, NativeError, SamplerChain, captured_stderr
from llama_srb.sampling.params import ParamError

# llama_token_data: {int32 id; float logit; float p}, 12 bytes, no padding.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


# What a grammar may be. llama.cpp parses GBNF and advances a grammar's stacks by recursion,
# one C++ frame per nesting level or rule reference: past some depth that overflows the
# thread's stack and kills the process without a word. It expands `x{m,n}` into n rules,
# and copies every rule into each branch's clone. These bounds keep every accepted grammar
# far inside the stack of the threads that parse and sample it (native.py; measured
# by bench/grammar_stack.py: 16,384 nested groups need less than 8 MiB) and its rules few.
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_GRAMMAR_DEPTH = 4096  # nested ( ) groups
MAX_GRAMMAR_REPEAT = 1024  # each bound of `{m,n}`
MAX_GRAMMAR_REPEATS = 4096  # all of them together
GRAMMAR_COMPLETE = -1  # what a constrained branch samples when its grammar allows nothing more
GRAMMAR_CANDIDATES = 1024  # the most likely tokens a rejecting grammar filters first

_EXCERPT_CHARS = 300


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


def parse_grammar(model: Model, text: str) -> C.llama_sampler_p:
    """llama.cpp's grammar sampler for GBNF `text`; ParamError with the parser's reason.
    Runs llama.cpp's recursive parser: call it on a big-stack thread (native_thread)."""
    check_grammar(text)
    with captured_stderr() as printed:
        grammar = C.llama_sampler_init_grammar(model.vocab, text.encode(), b"root")
    if not grammar:
        raise ParamError("grammar", _grammar_error(printed.text))
    return grammar


def clone_grammar(grammar: C.llama_sampler_p) -> C.llama_sampler_p:
    """An independent copy of a parsed grammar's state (no second parse)."""
    clone = C.llama_sampler_clone(grammar)
    if not clone:
        raise NativeError("llama_sampler_clone failed for a grammar")
    return clone


def _grammar_error(text: str) -> str:
    """The parser's own reason (`Undefined rule identifier 'x'`), from what llama.cpp
    printed; cut short, since the parser echoes the rest of the client's grammar."""
    marker = "error parsing grammar:"
    reason = text.split(marker, 1)[1].strip() if marker in text else text.strip()
    reason = reason.splitlines()[0] if reason else ""
    if len(reason) > _EXCERPT_CHARS:
        reason = reason[:_EXCERPT_CHARS] + "…"
    detail = f": {reason}" if reason else " (GBNF with a `root` rule expected)"
    return f"the grammar could not be parsed{detail}"


@functools.lru_cache(maxsize=4)
def token_ids(n_vocab: int) -> npt.NDArray[np.int32]:
    return np.arange(n_vocab, dtype=np.int32)


def candidates(
    logits: npt.NDArray[np.float32], ids: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.void], C.llama_token_data_array]:
    """llama.cpp's candidate array over `ids` with their `logits`, and the numpy buffer
    behind it (keep it alive while the array is used)."""
    data = np.empty(len(ids), TOKEN_DATA)
    data["id"] = ids
    data["logit"] = logits
    data["p"] = 0.0
    array = C.llama_token_data_array(
        data=data.ctypes.data_as(C.llama_token_data_p), size=len(data), selected=-1, sorted=False
    )
    return data, array


class ConstrainedChain:
    """A sampler chain whose every token is one the grammar allows."""

    def __init__(self, chain: SamplerChain, grammar: C.llama_sampler_p, n_vocab: int) -> None:
        self.chain = chain
        self.grammar: C.llama_sampler_p | None = grammar
        self.n_vocab = n_vocab

    def sample_row(self, logits: npt.NDArray[np.float32]) -> int:
        """The next token from `logits`, or GRAMMAR_COMPLETE when the grammar allows none
        of the tokens still possible (it is complete and end-of-generation is masked: the
        branch must end). Only a token the grammar allows is ever accepted: llama.cpp
        aborts the process on any other."""
        token = self._pick(logits, None, constrained=False)
        if not self._allows(token, float(logits[token])):
            token = self._pick_allowed(logits)
            if token == GRAMMAR_COMPLETE or not self._allows(token, float(logits[token])):
                return GRAMMAR_COMPLETE
        # Both learn the token only now: a rejected draw must not count as generated.
        C.llama_sampler_accept(self.grammar, token)
        C.llama_sampler_accept(self.chain.ptr, token)
        return token

    def _pick_allowed(self, logits: npt.NDArray[np.float32]) -> int:
        """A token the grammar allows. The grammar's cost is candidates times its parse
        stacks, and an adversarial grammar has thousands of stacks: it first filters the
        most likely candidates, and the whole vocabulary only if it allows none of them."""
        if self.n_vocab > GRAMMAR_CANDIDATES:
            top = np.argpartition(logits, -GRAMMAR_CANDIDATES)[-GRAMMAR_CANDIDATES:]
            token = self._pick(logits, top.astype(np.int32), constrained=True)
            if token != GRAMMAR_COMPLETE:
                return token
        return self._pick(logits, None, constrained=True)

    def _pick(
        self,
        logits: npt.NDArray[np.float32],
        ids: npt.NDArray[np.int32] | None,
        constrained: bool,
    ) -> int:
        """Apply the grammar (if `constrained`) and the chain to the candidates `ids`
        (None: the whole vocabulary) and return the chain's pick."""
        if ids is None:
            data, array = candidates(logits, token_ids(self.n_vocab))
        else:
            data, array = candidates(logits[ids], ids)
        if constrained:
            C.llama_sampler_apply(self.grammar, ctypes.byref(array))
            if not np.isfinite(data["logit"]).any():
                return GRAMMAR_COMPLETE
        C.llama_sampler_apply(self.chain.ptr, ctypes.byref(array))
        return int(array.data[array.selected].id)

    def _allows(self, token: int, logit: float) -> bool:
        one = C.llama_token_data(id=token, logit=logit, p=0.0)
        array = C.llama_token_data_array(
            data=ctypes.pointer(one), size=1, selected=-1, sorted=False
        )
        C.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return math.isfinite(one.logit)  # the grammar sets a token it rejects to -inf

    def close(self) -> None:
        self.chain.close()
        if self.grammar:
            C.llama_sampler_free(self.grammar)
            self.grammar = None

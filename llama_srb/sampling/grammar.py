"""Grammar-constrained sampling (GBNF, JSON, JSON schemas) through llama.cpp's grammar sampler.

Running the grammar over the whole vocabulary costs about 100 ms a token with a 262k
vocabulary (Gemma 3), while checking one token is nearly free. So a branch first samples
freely and asks the grammar about that one token; only when the grammar rejects it is the
vocabulary filtered and sampled again, as llama.cpp's own common sampler does.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import TYPE_CHECKING

import llama_cpp as C
import numpy as np
import numpy.typing as npt

from llama_srb.engine.native import Model, captured_stderr
from llama_srb.sampling.params import ParamError

if TYPE_CHECKING:
    from llama_srb.sampling.chain import SamplerChain

# llama_token_data: {int32 id; float logit; float p}, 12 bytes, no padding.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def parse_grammar(model: Model, text: str) -> C.llama_sampler_p:
    """llama.cpp's grammar sampler for GBNF `text`; ParamError with the parser's reason."""
    with captured_stderr() as printed:
        grammar = C.llama_sampler_init_grammar(model.vocab, text.encode(), b"root")
    if not grammar:
        raise ParamError("grammar", _grammar_error(printed.text))
    return grammar


def _grammar_error(text: str) -> str:
    """The parser's own reason (`Undefined rule identifier 'x'`), from what llama.cpp printed."""
    marker = "error parsing grammar:"
    reason = text.split(marker, 1)[1].strip().splitlines()[0] if marker in text else ""
    detail = f": {reason}" if reason else " (GBNF with a `root` rule expected)"
    return f"the grammar could not be parsed{detail}"


@functools.lru_cache(maxsize=4)
def _token_ids(n_vocab: int) -> npt.NDArray[np.int32]:
    return np.arange(n_vocab, dtype=np.int32)


class ConstrainedChain:
    """A sampler chain whose every token is one the grammar allows."""

    def __init__(self, chain: SamplerChain, grammar: C.llama_sampler_p, n_vocab: int) -> None:
        self.chain = chain
        self.grammar: C.llama_sampler_p | None = grammar
        self.n_vocab = n_vocab

    def sample(self, ctx: C.llama_context_p, batch_index: int) -> int:
        ptr = C.llama_get_logits_ith(ctx, batch_index)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        token = self._pick(logits, constrained=False)
        if not self._allows(token, float(logits[token])):
            token = self._pick(logits, constrained=True)
        # Both learn the token only now: a rejected draw must not count as generated.
        C.llama_sampler_accept(self.grammar, token)
        C.llama_sampler_accept(self.chain.ptr, token)
        return token

    def _pick(self, logits: npt.NDArray[np.float32], constrained: bool) -> int:
        data = np.empty(self.n_vocab, _TOKEN_DATA)
        data["id"] = _token_ids(self.n_vocab)
        data["logit"] = logits
        data["p"] = 0.0
        array = C.llama_token_data_array(
            data=data.ctypes.data_as(C.llama_token_data_p),
            size=self.n_vocab,
            selected=-1,
            sorted=False,
        )
        if constrained:
            C.llama_sampler_apply(self.grammar, ctypes.byref(array))
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

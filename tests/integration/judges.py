"""Judges of constrained output other than the server's own masks: whether a text is what
its constraint asks for, complete, or (for a choice cut by max_tokens) a start of it.

- JSON schemas: `jsonschema`.
- GBNF: llama.cpp's own grammar sampler (what served GBNF before llguidance), fed the
  text's tokens one by one; it judges a token by its text, so any tokenization will do.
- Lark grammars and regular expressions: llguidance over a vocabulary of the 256 bytes, so
  the text is judged byte by byte and no tokenizer's choices matter.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import jsonschema
import llama_cpp as C
import llguidance
import numpy as np
import numpy.typing as npt

from llama_srb.native import Model
from llama_srb.sampling.branch import TOKEN_DATA


class LlamaGrammar:
    """llama.cpp's grammar sampler for one GBNF text, asked about the whole vocabulary."""

    def __init__(self, model: Model, text: str) -> None:
        self.grammar = C.llama_sampler_init_grammar(model.vocab, text.encode(), b"root")
        assert self.grammar, "llama.cpp's parser refused the grammar"
        self.n_vocab = model.n_vocab

    def allowed(self) -> npt.NDArray[np.intp]:
        data = np.zeros(self.n_vocab, TOKEN_DATA)
        data["id"] = np.arange(self.n_vocab)
        array = C.llama_token_data_array(
            data=data.ctypes.data_as(C.llama_token_data_p),
            size=self.n_vocab,
            selected=-1,
            sorted=False,
        )
        C.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return np.flatnonzero(np.isfinite(data["logit"]))

    def allows(self, token: int) -> bool:
        """Whether `token` may come next (asked about that one token alone: cheap)."""
        data = np.zeros(1, TOKEN_DATA)
        data["id"] = token
        array = C.llama_token_data_array(
            data=data.ctypes.data_as(C.llama_token_data_p), size=1, selected=-1, sorted=False
        )
        C.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return bool(np.isfinite(data["logit"][0]))

    def accept(self, token: int) -> None:
        """Advance by `token`, which must be allowed (llama.cpp throws on one that is not)."""
        C.llama_sampler_accept(self.grammar, token)

    def close(self) -> None:
        C.llama_sampler_free(self.grammar)


def gbnf_verdict(model: Model, grammar: str, text: str, complete: bool) -> str | None:
    """None when llama.cpp's grammar takes `text` (and, if `complete`, lets it end there);
    else what it refused."""
    judge = LlamaGrammar(model, grammar)
    try:
        for token in model.tokenize(text, add_special=False, parse_special=False):
            if not judge.allows(token):
                return f"llama.cpp's grammar refuses {model.piece(token)!r} in {text!r}"
            judge.accept(token)
        if complete and not any(judge.allows(t) for t in model.eog_tokens):
            return f"llama.cpp's grammar does not let {text!r} end"
        return None
    finally:
        judge.close()


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, in llguidance's TokenizerWrapper
    shape."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([b]) for b in range(256)] + [b"<end>"]
        self.special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def llguidance_verdict(grammar: str, text: str, complete: bool) -> str | None:
    """None when llguidance's `grammar` (its own form: grammar_from_lark, _regex, ...)
    takes `text` byte by byte (and, if `complete`, is complete there); else why not."""
    matcher = llguidance.LLMatcher(BYTES, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    if not matcher.consume_tokens(list(text.encode())):
        return f"the grammar refuses {text!r}: {matcher.get_error()[:200]}"
    if complete and not matcher.is_accepting():
        return f"{text!r} is not complete"
    return None


def lark_verdict(lark: str, text: str, complete: bool) -> str | None:
    return llguidance_verdict(llguidance.LLMatcher.grammar_from_lark(lark), text, complete)


def regex_verdict(regex: str, text: str, complete: bool) -> str | None:
    return llguidance_verdict(llguidance.LLMatcher.grammar_from_regex(regex), text, complete)


def schema_verdict(schema: dict[str, Any], text: str, complete: bool) -> str | None:
    """A complete text must parse and validate; a cut one must be a start of JSON that the
    schema may still take (judged by llguidance's own compiler: jsonschema needs it whole)."""
    if not complete:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        return llguidance_verdict(grammar, text, complete=False)
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"{text!r} is not valid: {str(exc)[:300]}"
    return None

"""Output constraints through llguidance: JSON schemas, GBNF, Lark grammars and regular
expressions compiled once per request, and one matcher per branch.

llguidance (an Earley parser over a derivative-based lexer) bounds the work of every step
by the limits below: a grammar that needs more stops its branch with an error instead of
holding the engine. Compiling runs on a request worker; a grammar that cannot be used, or
that already fails its first step, is a ParamError (a 400) before anything is queued.

The tokenizer is the model's vocabulary as llguidance sees it (about 1-3 s to build on
Gemma 3's 262,144 tokens): built on first use and kept, one per model. Its end-of-
generation tokens are the model's EOG tokens, the ones the engine ends a branch on: a
grammar that is complete allows them, one that is not forbids them.
"""

from __future__ import annotations

import ctypes
import json
import threading
import weakref
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import llama_cpp
import llguidance
import llguidance.numpy

from llama_srb.native import Model
from llama_srb.sampling.errors import ParamError
from llama_srb.sampling.gbnf import gbnf_to_lark
from llama_srb.sampling.grammar import MAX_GRAMMAR_CHARS, check_grammar
from llama_srb.sampling.schema_bounds import as_llama_cpp_reads

# What one step of one matcher may cost, with llguidance's measured speeds: a step that
# would need more ends the branch with an error that names the limit. Earley items and
# lexer fuel are counted over a whole mask; at these bounds a mask costs at most ~15 ms on
# one core (bench/bench_constraint.py). The build limits bound compiling: grammar size
# (symbols), the lexer's first regexes, and its states (1-2 kB each).
STEP_MAX_ITEMS = 50_000  # Earley items per mask (~20k/ms)
STEP_LEXER_FUEL = 200_000  # lexer work per mask (~14k/ms)
MAX_ITEMS_IN_ROW = 2_000  # items of one Earley row: the grammar's branching at one point
INITIAL_LEXER_FUEL = 1_000_000  # building the lexer's regexes at compile (~50k/ms)
MAX_LEXER_STATES = 250_000
MAX_GRAMMAR_SIZE = 500_000


def parser_limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(
        max_items_in_row=MAX_ITEMS_IN_ROW,
        initial_lexer_fuel=INITIAL_LEXER_FUEL,
        step_lexer_fuel=STEP_LEXER_FUEL,
        step_max_items=STEP_MAX_ITEMS,
        max_lexer_states=MAX_LEXER_STATES,
        max_grammar_size=MAX_GRAMMAR_SIZE,
        verbose_errors=False,  # an error names the limit, not the client's grammar
    )


GRAMMAR_COMPLETE = -1  # what a constrained branch samples when its grammar allows nothing more

# JSON as llama.cpp's schema converter writes it: one space, or a newline and an indent,
# where JSON allows whitespace; never an endless run of it (a small model's favourite).
JSON_WHITESPACE = r"(?: |\n[ \t]{0,20})?"
_ERROR_CHARS = 400


class ConstraintKind(StrEnum):
    JSON_SCHEMA = "json_schema"  # a JSON schema (response_format, json_schema)
    GBNF = "gbnf"  # llama.cpp's GBNF; Lark when it starts with `%llguidance`, as there
    LARK = "lark"  # llguidance's Lark syntax
    REGEX = "regex"  # the whole output matches it (Rust regex syntax)


@dataclass(frozen=True)
class ConstraintSpec:
    """What a request asks its output to match; `param` names the field it came in."""

    kind: ConstraintKind
    source: str | dict[str, Any]  # a schema as a dict, everything else as text
    param: str


class Constraint:
    """A compiled constraint, shared by a request's branches: each takes `matcher()`."""

    def __init__(self, spec: ConstraintSpec, grammar: str, root: llguidance.LLMatcher) -> None:
        self.spec = spec
        self.grammar = grammar  # llguidance's form, for a log or a test
        self._root = root  # never advanced: branches copy it

    def matcher(self) -> Matcher:
        return Matcher(self._root.deep_copy())


class Matcher:
    """One branch's place in its grammar.

    Every call is bounded by the limits above; none raises on the grammar's account. A
    token the grammar does not allow, or a step past a limit, puts the matcher in an
    error state it never leaves: `error` says why, and the branch must end."""

    def __init__(self, inner: llguidance.LLMatcher) -> None:
        self.inner = inner  # for MaskBatch

    def consume(self, token: int) -> bool:
        """Advance by the sampled token; False (and `error` set) if it was not allowed."""
        return self.inner.consume_token(token)

    def consume_all(self, tokens: list[int]) -> bool:
        return self.inner.consume_tokens(tokens)

    def fork(self) -> Matcher:
        """An independent copy, at the same place (a branch forked from this one)."""
        return Matcher(self.inner.deep_copy())

    def rollback(self, n_tokens: int) -> bool:
        """Take back the last `n_tokens` consumed (a rewind); False if there are fewer."""
        return self.inner.rollback(n_tokens)

    def reset(self) -> bool:
        """Back to the start of the grammar."""
        return self.inner.reset()

    @property
    def is_accepting(self) -> bool:
        """The output so far is complete: an end-of-generation token may follow."""
        return self.inner.is_accepting()

    @property
    def is_stopped(self) -> bool:
        """Nothing but an end-of-generation token may follow (or it is in error)."""
        return self.inner.is_stopped()

    @property
    def error(self) -> str | None:
        """Why the matcher stopped in error (a limit, a token it refused), or None."""
        return _short(self.inner.get_error()) or None


class Constraints:
    """Compiles constraints for one model: its llguidance tokenizer (built once, on first
    use) and the limits. Safe from any thread; `compile` releases the GIL while
    llguidance builds the grammar. Call it on a big-stack thread (native.native_thread,
    as the request workers are): llguidance walks chains of rules recursively, and the
    4,096 nested groups the grammar limits allow overflow a default 8 MiB stack."""

    def __init__(self, model: Model) -> None:
        self.n_vocab = model.n_vocab
        self.eog_tokens = model.eog_tokens
        self._model = model
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = _tokenizer(self._model)
            return self._tokenizer

    def compile(self, spec: ConstraintSpec) -> Constraint:
        """The constraint, ready for matchers; ParamError(spec.param) saying why not."""
        grammar = self._grammar(spec)
        root = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=parser_limits())
        if root.is_error():
            raise ParamError(spec.param, _unusable(spec, root.get_error()))
        # The first mask now, on this worker: a grammar whose first step is already past
        # the limits is the client's 400, not an error in the middle of a stream.
        first = llguidance.numpy.allocate_token_bitmask(1, self.tokenizer.vocab_size)
        llguidance.numpy.fill_next_token_bitmask(root, first)
        if root.is_error():
            raise ParamError(spec.param, _unusable(spec, root.get_error()))
        return Constraint(spec, grammar, root)

    def _grammar(self, spec: ConstraintSpec) -> str:
        """llguidance's grammar for `spec` (its text is checked by the matcher)."""
        source = spec.source
        if spec.kind is ConstraintKind.JSON_SCHEMA:
            if not isinstance(source, dict):
                raise ParamError(spec.param, "the JSON schema must be an object")
            try:
                return llguidance.LLMatcher.grammar_from_json_schema(
                    json.dumps(as_llama_cpp_reads(source)),
                    defaults={"whitespace_pattern": JSON_WHITESPACE},
                )
            except ValueError as exc:
                raise ParamError(spec.param, _unusable(spec, str(exc))) from None
        if not isinstance(source, str):
            raise ParamError(spec.param, f"{spec.param} must be a string")
        if len(source) > MAX_GRAMMAR_CHARS:  # llguidance compiles rule chains recursively
            raise ParamError(
                spec.param, f"{spec.param} is {len(source)} characters; at most {MAX_GRAMMAR_CHARS}"
            )
        if spec.kind is ConstraintKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(source)
        if spec.kind is ConstraintKind.GBNF and not source.startswith("%llguidance"):
            try:  # the bounds of size, depth and repetition that llama.cpp's parser needs
                check_grammar(source)
            except ParamError as exc:
                raise ParamError(spec.param, str(exc)) from None
            source = gbnf_to_lark(
                source, self._token_for, self.n_vocab, self.eog_tokens, spec.param
            )
        return llguidance.LLMatcher.grammar_from_lark(source)

    def _token_for(self, spelled: str) -> int | None:
        tokens = self._model.tokenize(spelled, add_special=False, parse_special=True)
        return tokens[0] if len(tokens) == 1 else None


def _tokenizer(model: Model) -> llguidance.LLTokenizer:
    """The vocabulary as llama.cpp's grammar reads it: each token's text, and the tokens
    that write no text (control tokens, end of generation) as special ones, which only
    a grammar's token reference allows. (llguidance.llamacpp's own builder also makes
    special the tokens a vocabulary defines that look like tags, which Gemma 3 has by
    the thousand: `<table>`, `<h1>`; here they are text, as in llama.cpp.)"""
    special = b"\xff"  # llguidance's mark of a special token's name
    tokens = [model.piece(t) or special + model.special_piece(t) for t in range(model.n_vocab)]
    tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    return llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
        tokens=tokens,
        vocab_ptr=model.vocab,
        tokenize_fptr=tokenize,
        eos_token=list(model.eog_tokens),
        slices=None,
    )


_by_model: weakref.WeakKeyDictionary[Model, Constraints] = weakref.WeakKeyDictionary()
_by_model_lock = threading.Lock()


def constraints_for(model: Model) -> Constraints:
    """The model's one Constraints (and so one tokenizer), wherever it is asked for."""
    with _by_model_lock:
        found = _by_model.get(model)
        if found is None:
            found = _by_model[model] = Constraints(model)
        return found


_WHAT = {
    ConstraintKind.JSON_SCHEMA: "the JSON schema cannot be used",
    ConstraintKind.GBNF: "the grammar cannot be used",
    ConstraintKind.LARK: "the Lark grammar cannot be used",
    ConstraintKind.REGEX: "the regular expression cannot be used",
}


def _unusable(spec: ConstraintSpec, reason: str) -> str:
    return f"{_WHAT[spec.kind]}: {_short(reason)}"


# llguidance's word for a place that no token extends and where the output is not complete
# (a grammar whose rules never end, or a branch into a rule nothing matches).
_DEAD_END = "NoExtensionBias"
_DEAD_END_REASON = (
    "no text can follow here and the output is not complete (a rule that never ends?)"
)


def _short(message: str) -> str:
    message = message.replace("<non-verbose/>", "").strip()
    if message.startswith(_DEAD_END):
        message = _DEAD_END_REASON
    return message if len(message) <= _ERROR_CHARS else message[:_ERROR_CHARS] + "…"

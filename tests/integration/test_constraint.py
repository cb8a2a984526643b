"""sampling/constraint.py and masks.py on the real vocabulary, without a server: every kind
of constraint compiles (or says why not), matchers fork, roll back and end where the engine
ends a branch, batched masks equal one-by-one masks, and the inputs that held llama.cpp's
grammar sampler for minutes (README, Known limits; issue 28) end after a bounded number of
steps, each with an error or an answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest

from llama_srb.bundled_model import bundled_model_path
from llama_srb.native import Model, native_thread
from llama_srb.sampling.constraint import (
    Constraint,
    ConstraintKind,
    Constraints,
    ConstraintSpec,
    Matcher,
    constraints_for,
)
from llama_srb.sampling.cut import Row
from llama_srb.sampling.masks import MaskBatch, allowed, allowed_tokens
from llama_srb.sampling.params import ParamError
from tests.support.pathological import chain

SCHEMA = {
    "type": "object",
    "properties": {"mood": {"enum": ["calm", "stormy"]}, "lit": {"type": "boolean"}},
    "required": ["mood", "lit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(bundled_model: str) -> Iterator[Model]:
    loaded = Model(bundled_model_path(bundled_model))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def constraints(model: Model) -> Constraints:
    return constraints_for(model)


def compile_(constraints: Constraints, kind: ConstraintKind, source: Any) -> Matcher:
    return constraints.compile(ConstraintSpec(kind, source, "p")).matcher()


def tokens(model: Model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False, parse_special=False)


def sample(model: Model, matcher: Matcher, seed: int, steps: int = 200) -> tuple[str, bool]:
    """Random tokens the masks allow, until end of generation: the text, and whether the
    grammar ended it."""
    masks, rng, out = MaskBatch(model.n_vocab), np.random.default_rng(seed), []
    for _ in range(steps):
        ids = allowed_tokens(masks.fill([matcher])[0], model.n_vocab)
        assert matcher.error is None and len(ids) > 0
        # Short tokens first, so that a walk ends in few steps: a random one of the 20.
        ids = ids[np.argsort([len(model.piece(int(t))) for t in ids], kind="stable")][:20]
        token = int(rng.choice(ids))
        if token in model.eog_tokens:
            return model.text(out), True
        assert matcher.consume(token), matcher.error
        out.append(token)
    return model.text(out), False


def test_one_tokenizer_per_model(model: Model) -> None:
    assert constraints_for(model) is constraints_for(model)
    first = constraints_for(model).tokenizer
    assert constraints_for(model).tokenizer is first
    assert first.vocab_size == model.n_vocab
    assert sorted(first.eos_tokens) == sorted(model.eog_tokens)


@pytest.mark.parametrize(
    ("kind", "source", "valid"),
    [
        (ConstraintKind.JSON_SCHEMA, SCHEMA, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
        (ConstraintKind.REGEX, r"[0-9]{3}-[a-z]{2,4}", None),
        (ConstraintKind.LARK, 'start: "yes" | "no" NUM\nNUM: /[0-9]+/', None),
        (ConstraintKind.GBNF, 'root ::= "ab" [0-9]{2}', None),
        (ConstraintKind.GBNF, '%llguidance {}\nstart: "x"+', None),  # llama.cpp's marker
    ],
)
def test_each_kind_samples_only_what_it_allows(
    model: Model, constraints: Constraints, kind: ConstraintKind, source: Any, valid: Any
) -> None:
    import re

    patterns = {
        r"[0-9]{3}-[a-z]{2,4}": r"[0-9]{3}-[a-z]{2,4}",
        'start: "yes" | "no" NUM\nNUM: /[0-9]+/': r"yes|no[0-9]+",
        'root ::= "ab" [0-9]{2}': r"ab[0-9]{2}",
        '%llguidance {}\nstart: "x"+': r"x+",
    }
    for seed in range(3):
        text, ended = sample(model, compile_(constraints, kind, source), seed)
        assert ended, text
        if valid is not None:
            valid(text)
        else:
            assert re.fullmatch(patterns[source], text), text


def test_a_complete_grammar_allows_exactly_the_end_of_generation(
    model: Model, constraints: Constraints
) -> None:
    matcher = compile_(constraints, ConstraintKind.GBNF, 'root ::= "Yes"')
    masks = MaskBatch(model.n_vocab)
    assert not set(allowed_tokens(masks.fill([matcher])[0], model.n_vocab)) & set(model.eog_tokens)
    assert matcher.consume_all(tokens(model, "Yes"))
    assert matcher.is_accepting and matcher.is_stopped
    assert set(allowed_tokens(masks.fill([matcher])[0], model.n_vocab)) == set(model.eog_tokens)


def test_a_refused_token_is_an_error_state(model: Model, constraints: Constraints) -> None:
    matcher = compile_(constraints, ConstraintKind.GBNF, 'root ::= "Yes"')
    assert not matcher.consume(tokens(model, "No")[0])
    assert matcher.error and matcher.is_stopped


def test_fork_is_independent_and_rollback_restores(model: Model, constraints: Constraints) -> None:
    grammar = 'root ::= "a" ("b" | "c") "d"'
    first = compile_(constraints, ConstraintKind.GBNF, grammar)
    a, b, c, d = (tokens(model, x)[0] for x in "abcd")
    assert first.consume(a)
    fork = first.fork()
    assert first.consume(b) and fork.consume(c)  # each its own way
    masks = MaskBatch(model.n_vocab)
    rows = masks.fill([first, fork])
    assert allowed_tokens(rows[0], model.n_vocab).tolist() == [d]
    assert allowed_tokens(rows[1], model.n_vocab).tolist() == [d]
    assert first.consume(d) and first.is_accepting
    assert first.rollback(2)  # back to after "a": "b" or "c" again
    assert set(allowed_tokens(masks.fill([first])[0], model.n_vocab)) >= {b, c}
    assert first.consume(c) and first.consume(d) and first.is_accepting
    assert not first.rollback(10)  # more than it consumed


def test_batched_masks_are_the_masks_one_by_one(model: Model, constraints: Constraints) -> None:
    specs = [
        (ConstraintKind.JSON_SCHEMA, SCHEMA),
        (ConstraintKind.REGEX, r"[a-z]+ [0-9]+"),
        (ConstraintKind.GBNF, "root ::= [a-z]+ [ ] [0-9]+"),
    ]
    matchers = [compile_(constraints, k, s) for k, s in specs for _ in range(3)]
    for i, m in enumerate(matchers):  # each at another place
        m.consume_all(tokens(model, ['{"mood": "c', "ab", "xy"][i // 3])[: i % 3])
    together = MaskBatch(model.n_vocab, threads=2).fill(matchers).copy()
    alone = MaskBatch(model.n_vocab)
    for i, m in enumerate(matchers):
        assert np.array_equal(together[i], alone.fill([m.fork()])[0])


def test_a_masked_row_and_allowed_tokens_agree(model: Model, constraints: Constraints) -> None:
    matcher = compile_(constraints, ConstraintKind.REGEX, r"[0-9]+")
    row = MaskBatch(model.n_vocab).fill([matcher])[0]
    logits = np.random.default_rng(0).standard_normal(model.n_vocab).astype(np.float32)
    before = logits.copy()
    Row(logits).mask(row)
    ids = allowed_tokens(row, model.n_vocab)
    assert np.array_equal(np.flatnonzero(np.isfinite(logits)), ids)
    assert np.array_equal(logits[ids], before[ids])
    assert allowed(row, model.n_vocab).sum() == len(ids) > 0
    assert all(model.piece(int(t)).isdigit() for t in ids)


@pytest.mark.parametrize(
    ("kind", "source", "words"),
    [
        (ConstraintKind.REGEX, "a(b", "unclosed group"),
        (ConstraintKind.LARK, "start: foo", 'unknown name: "foo"'),
        (ConstraintKind.GBNF, "root ::= nothing", "Undefined rule identifier 'nothing'"),
        (ConstraintKind.GBNF, 'root ::= "a', "unexpected end of input"),
        (ConstraintKind.GBNF, "root ::= foo_bar\nfoo ::= 'x'", "expecting newline or end"),
        (ConstraintKind.GBNF, 'root ::= "a"{3000}', "repeats an item 3000 times"),
        (ConstraintKind.GBNF, "root ::= <[999999999]>", "not in the vocabulary"),
        (ConstraintKind.GBNF, "root ::= <not one token at all>", "invalid token"),
        (ConstraintKind.GBNF, "root ::= root", "no text can follow here"),  # never ends
        (ConstraintKind.LARK, 'start: x\nx: x "a"', "no text can follow here"),
        (ConstraintKind.JSON_SCHEMA, {"type": "?"}, "Invalid type"),
        (ConstraintKind.JSON_SCHEMA, {"type": "string", "format": "zzz"}, "Unknown format"),
        (ConstraintKind.JSON_SCHEMA, {"type": "array", "uniqueItems": True}, "uniqueItems"),
        (ConstraintKind.JSON_SCHEMA, "not a dict", "must be an object"),
    ],
)
def test_bad_input_is_a_param_error_that_says_why(
    constraints: Constraints, kind: ConstraintKind, source: Any, words: str
) -> None:
    with pytest.raises(ParamError) as caught:
        constraints.compile(ConstraintSpec(kind, source, "field"))
    assert caught.value.param == "field"
    assert words in str(caught.value)
    assert len(str(caught.value)) < 500


def test_a_dead_end_says_so(model: Model, constraints: Constraints) -> None:
    """A branch into a rule that never ends: the matcher's error says why, in words."""
    matcher = compile_(constraints, ConstraintKind.LARK, 'start: "a" x | "b"\nx: x "c"')
    assert matcher.consume(tokens(model, "a")[0])
    MaskBatch(model.n_vocab).fill([matcher])
    assert matcher.error is not None and matcher.error.startswith("no text can follow here")


PATHOLOGICAL = {
    "1,600 chained alternatives": (ConstraintKind.GBNF, chain(1600), "w"),
    "950 chained alternatives": (ConstraintKind.GBNF, chain(950), "w"),
    '("a"|"a")*': (ConstraintKind.GBNF, 'root ::= ("a"|"a")*', "a"),
    "nested {0,100} pattern": (
        ConstraintKind.JSON_SCHEMA,
        {"type": "string", "pattern": "^((a{0,100}){0,100}){0,100}$"},
        "a",
    ),
    "4,096 nested groups": (
        ConstraintKind.GBNF,
        "root ::= " + "(" * 4096 + '"a"' + ")" * 4096,
        "a",
    ),
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_inputs_end_in_bounded_steps(
    model: Model, constraints: Constraints, name: str
) -> None:
    """Eight branches write as many `a`s (or `w`s) as each grammar lets them, for at most
    64 steps: each either refuses the grammar at once, ends, keeps going step after step
    (each step bounded by the limits), or stops with an error naming a limit."""
    kind, source, letter = PATHOLOGICAL[name]
    compiled: list[Constraint | ParamError] = []

    def compile_on_a_worker_stack() -> None:  # as the server's request workers do
        try:
            compiled.append(constraints.compile(ConstraintSpec(kind, source, "p")))
        except ParamError as exc:
            compiled.append(exc)

    native_thread(compile_on_a_worker_stack, "compile").join()
    if isinstance(compiled[0], ParamError):
        assert "cannot" in str(compiled[0]) or "could not" in str(compiled[0])
        return
    matchers = [compiled[0].matcher() for _ in range(8)]
    masks = MaskBatch(model.n_vocab)
    (preferred,) = tokens(model, letter)
    for _ in range(64):
        rows = masks.fill(matchers)
        if matchers[0].error is not None:
            assert "limit" in matchers[0].error or "too" in matchers[0].error
            return
        ids = allowed_tokens(rows[0], model.n_vocab)
        token = preferred if preferred in ids else int(ids[0])
        if token in model.eog_tokens:
            return
        for m in matchers:
            m.consume(token)

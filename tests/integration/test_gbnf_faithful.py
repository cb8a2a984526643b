"""GBNF through llguidance allows what llama.cpp's own grammar sampler allows.

Each grammar is walked token by token on the real vocabulary, with llama.cpp's grammar
sampler (llama_sampler_init_grammar) and the converted grammar's llguidance matcher side
by side: at every step the two sets of allowed tokens, end-of-generation included, must be
the same, but for two differences in tokens, never in text: where the grammar forces the
next bytes, llguidance allows only their canonical tokens (llama.cpp also allows tokens
that spell a shorter part of them), and tokens that are not whole UTF-8 characters (byte
tokens) are judged exactly by llguidance, approximately by llama.cpp (which refuses some
that a negated class may still complete, and allows lead bytes no character has). The
grammars are every one in llama.cpp's grammars/ folder (tests/data/
llama_cpp_grammars, from the llama.cpp that llama-cpp-python 0.3.36 vendors), the GBNF that
llama-cpp-python's converter writes for the suite's schemas (tests/integration/
test_constrained.py, tests/unit/test_constraints.py, test_adversarial.py), and small
grammars where a lexer that matched greedily would change the language.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from llama_srb.bundled_model import bundled_model_path
from llama_srb.native import Model
from llama_srb.sampling.constraint import (
    ConstraintKind,
    Constraints,
    ConstraintSpec,
    Matcher,
    constraints_for,
)
from llama_srb.sampling.masks import MaskBatch, allowed_tokens
from tests.integration.judges import LlamaGrammar

GRAMMARS = Path(__file__).parent.parent / "data" / "llama_cpp_grammars"
SCHEMAS = {
    "lighthouse": {
        "type": "object",
        "properties": {"mood": {"enum": ["calm", "stormy"]}, "lit": {"type": "boolean"}},
        "required": ["mood", "lit"],
        "additionalProperties": False,
    },
    "color": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}},
        "required": ["color"],
    },
    "ok": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
}
# A greedy lexer would end none of these where GBNF may: the run eats what follows it.
GREEDY_TRAPS = {
    "run then its own letter": 'root ::= word "x"\nword ::= [a-z]*',
    "shorter alternative first": 'root ::= ("a" | "ab") "b"',
    "digits then a digit": "root ::= [0-9]+ [0-9]",
}
STEPS = 8


def grammar_cases() -> dict[str, str]:
    cases = {path.name: path.read_text() for path in sorted(GRAMMARS.glob("*.gbnf"))}
    cases.update({f"schema {k}": json_schema_to_gbnf(json.dumps(s)) for k, s in SCHEMAS.items()})
    cases.update(GREEDY_TRAPS)
    return cases


@pytest.fixture(scope="module")
def model(bundled_model: str) -> Iterator[Model]:
    loaded = Model(bundled_model_path(bundled_model))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def constraints(model: Model) -> Constraints:
    return constraints_for(model)


def walk(
    model: Model, constraints: Constraints, text: str, seed: int
) -> Iterator[tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], Matcher]]:
    """Both allowed sets at each step of one random walk, and the matcher."""
    matcher = constraints.compile(ConstraintSpec(ConstraintKind.GBNF, text, "grammar")).matcher()
    llama = LlamaGrammar(model, text)
    masks = MaskBatch(model.n_vocab)
    rng = np.random.default_rng(seed)
    eog = set(model.eog_tokens)
    try:
        for _ in range(STEPS):
            ours = allowed_tokens(masks.fill([matcher])[0], model.n_vocab)
            theirs = llama.allowed()
            yield ours, theirs, matcher
            text_tokens = [t for t in np.intersect1d(ours, theirs) if t not in eog]
            if not text_tokens:
                return
            token = int(rng.choice(text_tokens))
            assert matcher.consume(token), matcher.error
            llama.accept(token)
    finally:
        llama.close()


@pytest.mark.parametrize("name", list(grammar_cases()))
def test_llguidance_allows_what_llama_cpp_allows(
    model: Model, constraints: Constraints, name: str
) -> None:
    text = grammar_cases()[name]
    steps = 0
    for seed in (1, 2):
        for ours, theirs, matcher in walk(model, constraints, text, seed):
            steps += 1
            forced = matcher.inner.compute_ff_bytes()
            only_ours = [
                t for t in sorted(set(ours) - set(theirs)) if not partial_character(model.piece(t))
            ][:5]
            only_theirs = [
                t
                for t in sorted(set(theirs) - set(ours))
                if not (forced.startswith(model.piece(t)) or partial_character(model.piece(t)))
            ][:5]
            assert not only_ours and not only_theirs, (
                f"step {steps}: only llguidance allows {[model.piece(t) for t in only_ours]},"
                f" only llama.cpp {[model.piece(t) for t in only_theirs]}"
            )
            eog_allowed = bool(set(model.eog_tokens) & set(ours))
            assert eog_allowed == matcher.is_accepting
    assert steps > 1


def partial_character(piece: bytes) -> bool:
    try:
        piece.decode()
    except UnicodeDecodeError:
        return True
    return False


def test_a_greedy_trap_ends_where_gbnf_ends(model: Model, constraints: Constraints) -> None:
    """`word "x"` with `word ::= [a-z]*`: "abx" is complete (a greedy lexer never ends)."""
    text = GREEDY_TRAPS["run then its own letter"]
    matcher = constraints.compile(ConstraintSpec(ConstraintKind.GBNF, text, "grammar")).matcher()
    for char in "abx":
        (token,) = model.tokenize(char, add_special=False, parse_special=False)
        assert matcher.consume(token), matcher.error
    assert matcher.is_accepting

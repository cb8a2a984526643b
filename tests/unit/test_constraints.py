"""Request constraints → grammar text and logit bias, with 400-worthy errors (no model)."""

from __future__ import annotations

from typing import Any

import pytest
from llama_cpp.llama_grammar import JSON_GBNF

from llama_srb.api.input.params import grammar_for, logit_bias
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.sampling.params import ParamError

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}},
    "required": ["color"],
}


def fields(**body: Any) -> SamplingFields:
    return SamplingFields.model_validate(body)


def test_no_constraint_no_grammar() -> None:
    assert grammar_for(fields()) is None
    assert grammar_for(fields(response_format={"type": "text"})) is None


def test_json_object_uses_the_stock_json_grammar() -> None:
    assert grammar_for(fields(response_format={"type": "json_object"})) == JSON_GBNF


@pytest.mark.parametrize(
    "body",
    [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": SCHEMA},
            }
        },
        {"response_format": {"type": "json_object", "schema": SCHEMA}},  # llama.cpp's form
        {"json_schema": SCHEMA},  # llama.cpp's extension
    ],
)
def test_schemas_become_gbnf(body: dict[str, Any]) -> None:
    grammar = grammar_for(fields(**body))
    assert grammar is not None and "root ::=" in grammar and '"\\"red\\""' in grammar


def test_grammar_passes_through() -> None:
    assert grammar_for(fields(grammar='root ::= "a"')) == 'root ::= "a"'


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs `json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
            "response_format",
            "Unrecognized schema",
        ),
        ({"json_schema": {"$ref": "#/nowhere"}}, "json_schema", "cannot be used"),
        (
            {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
            "response_format",
            "only one of grammar, response_format",
        ),
    ],
)
def test_bad_constraints_say_what_is_wrong(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ParamError, match=words) as error:
        grammar_for(fields(**body))
    assert error.value.param == param


def test_logit_bias_pairs() -> None:
    assert logit_bias({"5": -100, "7": 2.5}, n_vocab=10) == ((5, -100.0), (7, 2.5))
    assert logit_bias(None, n_vocab=10) == ()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"abc": 1}, "keys are token ids"),
        ({"10": 1}, "not in the vocabulary"),
        ({"-1": 1}, "not in the vocabulary"),
        ({"3": 101}, r"must be in \[-100, 100\]"),
        ({"3": float("nan")}, r"must be in \[-100, 100\]"),
    ],
)
def test_bad_logit_bias(raw: dict[str, float], words: str) -> None:
    with pytest.raises(ParamError, match=words) as error:
        logit_bias(raw, n_vocab=10)
    assert error.value.param == "logit_bias"

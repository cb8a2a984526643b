"""Request constraints → what the output must match (compiled by llguidance later:
tests/integration/test_constraint.py) and logit bias, with 400-worthy errors (no model)."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest

from llama_srb.api.input.params import constraint_spec, logit_bias
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.sampling.constraint import JSON_WHITESPACE, ConstraintKind, ConstraintSpec
from llama_srb.sampling.params import ParamError
from llama_srb.sampling.schema_bounds import (
    ANY_JSON_OBJECT,
    NUMBER_BOUND,
    STRING_LENGTH,
    as_llama_cpp_reads,
)
from tests.integration.judges import llguidance_verdict

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}},
    "required": ["color"],
}


def fields(**body: Any) -> SamplingFields:
    return SamplingFields.model_validate(body)


def test_no_constraint() -> None:
    assert constraint_spec(fields()) is None
    assert constraint_spec(fields(response_format={"type": "text"})) is None
    assert constraint_spec(fields(grammar="")) is None  # SillyTavern's "no grammar"


def test_json_object_asks_for_any_object() -> None:
    spec = constraint_spec(fields(response_format={"type": "json_object"}))
    assert spec == ConstraintSpec(ConstraintKind.JSON_SCHEMA, ANY_JSON_OBJECT, "response_format")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "c", "schema": SCHEMA},
                }
            },
            "response_format",
        ),
        ({"response_format": {"type": "json_object", "schema": SCHEMA}}, "response_format"),
        ({"json_schema": SCHEMA}, "json_schema"),  # llama.cpp's extension
    ],
)
def test_schemas_from_every_field(body: dict[str, Any], param: str) -> None:
    assert constraint_spec(fields(**body)) == ConstraintSpec(
        ConstraintKind.JSON_SCHEMA, SCHEMA, param
    )


def test_grammars_and_regular_expressions_by_their_kind() -> None:
    gbnf = 'root ::= "a"'
    lark = 'start: "a" | "b"'
    assert constraint_spec(fields(grammar=gbnf)) == ConstraintSpec(
        ConstraintKind.GBNF, gbnf, "grammar"
    )
    assert constraint_spec(fields(guided_grammar=lark)).kind is ConstraintKind.LARK
    assert constraint_spec(fields(guided_grammar=gbnf)).kind is ConstraintKind.GBNF
    regex = constraint_spec(fields(guided_regex="[0-9]{3}"))
    assert regex == ConstraintSpec(ConstraintKind.REGEX, "[0-9]{3}", "guided_regex")
    assert constraint_spec(fields(regex="a+")).param == "guided_regex"  # SGLang's name


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs `json_schema"),
        (
            {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
            "response_format",
            "only one of grammar, response_format",
        ),
        ({"json_schema": SCHEMA, "guided_regex": "a"}, "guided_regex", "only one of"),
        ({"json_schema": {"type": "array", "maxItems": 5000}}, "json_schema", "too large"),
    ],
)
def test_bad_constraints_say_what_is_wrong(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ParamError, match=words) as error:
        constraint_spec(fields(**body))
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


def test_objects_with_properties_have_no_others_as_llama_cpp_reads_a_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "list": {"type": "array", "items": {"properties": {}}},
        },
        "anyOf": [{"properties": {"q": {}}, "additionalProperties": True}],
    }
    closed = as_llama_cpp_reads(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False  # a key, not a map
    assert "additionalProperties" not in closed["properties"]  # the map of properties itself
    assert closed["properties"]["list"]["items"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is True  # what the client said stays
    assert "additionalProperties" not in schema  # a copy


def bounded(schema: dict[str, Any], text: str) -> bool:
    """Whether llguidance takes `text` whole under `schema` as the server compiles it."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(as_llama_cpp_reads(schema)), defaults={"whitespace_pattern": JSON_WHITESPACE}
    )
    return llguidance_verdict(grammar, text, complete=True) is None


@pytest.mark.parametrize(
    ("schema", "text", "taken"),
    [
        ({"type": "integer"}, "9" * 16, True),
        ({"type": "integer"}, "-" + "9" * 16, True),
        ({"type": "integer"}, "2" * 17, False),  # llama.cpp's converter: 16 digits at most
        ({"type": "number"}, "0." + "1" * 10, True),
        ({"type": "number"}, "0." + "1" * 11, False),
        ({"type": "number"}, "2" * 17, False),
        ({"type": "string"}, '"' + "a" * STRING_LENGTH + '"', True),
        ({"type": "string"}, '"' + "a" * (STRING_LENGTH + 1) + '"', False),
        ({"type": ["integer", "null"]}, "2" * 17, False),
        # what the schema says wins
        ({"type": "integer", "maximum": 10**18}, "9" * 18, True),
        ({"type": "integer", "minimum": 10**12}, str(10**12 + NUMBER_BOUND), True),
        ({"type": "integer", "minimum": 10**12}, str(2 * NUMBER_BOUND), False),
        ({"type": "number", "multipleOf": 0.5}, "2.5", True),
        ({"type": "string", "maxLength": 3}, '"abcd"', False),
        ({"type": "string", "pattern": "^a+$"}, '"' + "a" * 2000 + '"', True),
        ({"enum": [10**20]}, str(10**20), True),
        # json_object: any object, its values bounded too
        (ANY_JSON_OBJECT, '{"a": [1, "x", {"b": null}], "c": true}', True),
        (ANY_JSON_OBJECT, '{"a": {"b": [' + "2" * 17 + "]}}", False),
    ],
)
def test_answers_close_as_llama_cpps_converter_bounds_them(
    schema: dict[str, Any], text: str, taken: bool
) -> None:
    assert bounded(schema, text) is taken

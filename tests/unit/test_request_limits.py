"""What a request may ask for, checked before anything reaches llama.cpp (no model)."""

from __future__ import annotations

import pytest

from llama_srb.api.input.params import constraint_spec
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.sampling.grammar import (
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_REPEAT,
    MAX_GRAMMAR_REPEATS,
    check_grammar,
)
from llama_srb.sampling.params import ParamError, SamplingParams


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "(((((" [(]* "{99999}"  # ( { inside strings, classes and comments',
        "root ::= " + "(" * MAX_GRAMMAR_DEPTH + '"a"' + ")" * MAX_GRAMMAR_DEPTH,
        f'root ::= "a"{{0,{MAX_GRAMMAR_REPEAT}}}',
        'root ::= "\\"(" x\nx ::= [\\]({] "b"',
    ],
)
def test_grammars_within_the_limits_pass(grammar: str) -> None:
    check_grammar(grammar)


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        ("root ::= " + "(" * (MAX_GRAMMAR_DEPTH + 1) + '"a"', "nests"),
        (f'root ::= "a"{{{MAX_GRAMMAR_REPEAT + 1}}}', "repeats an item"),
        (f'root ::= "a"{{2,{MAX_GRAMMAR_REPEAT + 1}}}', "repeats an item"),
        ('root ::= "a"{0,1000} ' * (MAX_GRAMMAR_REPEATS // 1000 + 1), "add up"),
        ('root ::= "' + "a" * 70_000 + '"', "characters long"),
        ('root ::= "a"\n# a comment ends at \r too\rx ::= "a"{0,5000}', "repeats an item"),
    ],
)
def test_grammars_beyond_the_limits_are_refused(grammar: str, says: str) -> None:
    with pytest.raises(ParamError, match=says):
        check_grammar(grammar)


def test_schema_keywords_that_ask_for_many_items_are_bounded() -> None:
    def spec(schema: object) -> object:
        return constraint_spec(SamplingFields.model_validate({"json_schema": schema}))

    nested = {"type": "object", "properties": {"a": {"type": "array", "maxItems": 5000}}}
    with pytest.raises(ParamError, match="maxItems: 5000"):
        spec(nested)
    spec({"type": "string", "maxLength": MAX_GRAMMAR_REPEAT})
    for odd in (1e9, "1000", -1, True):
        with pytest.raises(ParamError, match="must be an integer"):
            spec({"type": "array", "maxItems": odd})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"repeat_last_n": 2**33}, "repeat_last_n"),
        ({"stop": ("x",) * 65}, "stop"),
        ({"stop": ("",)}, "stop"),
        ({"dry_sequence_breakers": ("z" * 65,)}, "dry_sequence_breakers"),
    ],
)
def test_params_out_of_bounds(fields: dict, param: str) -> None:
    with pytest.raises(ParamError) as raised:
        SamplingParams(**fields)
    assert raised.value.param == param


def test_model_limits() -> None:
    SamplingParams(top_k=100).check_model_limits(n_vocab=100, n_ctx=64)
    with pytest.raises(ParamError, match="top_k"):
        SamplingParams(top_k=101).check_model_limits(n_vocab=100, n_ctx=64)
    with pytest.raises(ParamError, match="repeat_last_n"):
        SamplingParams(repeat_last_n=65).check_model_limits(n_vocab=100, n_ctx=64)

"""The request schemas against the engine's parameters: every sampler setting a client may
send is declared once (SamplingParams holds its default), and every route reads it."""

from __future__ import annotations

from dataclasses import fields

import pytest
from pydantic import BaseModel

from llama_srb.api.schemas.chat import ChatRequest
from llama_srb.api.schemas.completions import CompletionRequest
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.api.schemas.sampling import SAMPLING_FIELDS, SamplingFields
from llama_srb.sampling.params import SamplingParams

# Declared by each route under its own name and default (max_tokens, n_predict, ...).
PER_ROUTE = {"max_tokens", "sampler_order"}  # sampler_order: from /completion's `samplers`
# Request fields that are not sampler settings passed through as they are.
NOT_PASSED_THROUGH = {
    "model",
    "n",
    "stream",
    "stream_options",
    "user",
    "logit_bias",  # checked against the vocabulary (input/params.py)
    "grammar",  # like response_format and json_schema: one grammar (input/params.py)
    "response_format",
    "json_schema",
    "guided_regex",
    "guided_grammar",
    "best_of",  # like n: how many branches (api/service.py)
}
ROUTES: list[type[SamplingFields]] = [CompletionRequest, ChatRequest, NativeCompletionRequest]


def test_every_sampling_parameter_is_a_request_field() -> None:
    missing = sorted(SAMPLING_FIELDS - PER_ROUTE - set(SamplingFields.model_fields))
    assert missing == [], "SamplingParams fields clients cannot set: declare them in SamplingFields"


def test_every_request_field_is_a_sampling_parameter_or_known() -> None:
    unknown = set(SamplingFields.model_fields) - SAMPLING_FIELDS - NOT_PASSED_THROUGH
    assert unknown == set(), "SamplingFields fields that reach no SamplingParams field"


@pytest.mark.parametrize("model", [SamplingFields, *ROUTES])
def test_sampler_defaults_are_declared_once_in_sampling_params(model: type[BaseModel]) -> None:
    """A request default other than None would shadow SamplingParams' own."""
    shadowing = {
        name: info.default
        for name, info in model.model_fields.items()
        if name in SAMPLING_FIELDS and info.default is not None
    }
    assert shadowing == {}


@pytest.mark.parametrize("model", ROUTES)
def test_an_empty_request_gets_sampling_params_defaults(model: type[SamplingFields]) -> None:
    body = model.model_validate({"prompt": "x", "messages": [{"role": "user", "content": "x"}]})
    assert body.sampling_params() == SamplingParams()


# A valid value other than the default, where the rule below would not give one.
EXAMPLES: dict[str, object] = {"dry_base": 2.0, "mirostat": 2}
# Fields of a shape the rule cannot invent a value for: tested where they are parsed.
SIMPLE = {"bool", "int", "float", "int | None", "tuple[str, ...]"}


@pytest.mark.parametrize(
    "name",
    sorted(f.name for f in fields(SamplingParams) if f.name in SAMPLING_FIELDS - PER_ROUTE),
)
def test_each_passed_through_field_reaches_sampling_params(name: str) -> None:
    """A value other than the default, sent by a client, arrives in SamplingParams."""
    kind = next(str(f.type) for f in fields(SamplingParams) if f.name == name)
    if name not in EXAMPLES and kind not in SIMPLE:
        pytest.skip(f"{name}: {kind} needs its own test")
    default = getattr(SamplingParams(), name)
    value = EXAMPLES.get(name)
    if value is None:
        if isinstance(default, bool):
            value = not default
        elif isinstance(default, tuple):
            value = ["a", "b"]
        elif isinstance(default, float):
            value = 0.5 if default != 0.5 else 0.25
        else:  # int, or None (seed)
            value = (default or 0) + 1
    body = CompletionRequest.model_validate({"prompt": "x", name: value})
    got = getattr(body.sampling_params(), name)
    assert got == (tuple(value) if isinstance(value, list) else value)

"""The request fields every generation route shares: the sampler settings, the output
constraints and the prompt's shape, with other servers' names mapped (dialects.py)."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llama_srb.api.schemas import dialects
from llama_srb.sampling.params import SamplingParams

# Passed through as the client sent them. logit_bias and grammar need the vocabulary and
# the JSON-schema converter (api/input/params.py); logprobs differs between the routes.
# Each is declared below with a None default, so that SamplingParams' default rules; a
# unit test (tests/unit/test_api_schemas.py) checks that none is missing.
SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams)) - {
    "logit_bias",
    "grammar",
    "constraint",
    "logprobs",
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`; `schema` beside `json_object` is llama.cpp's variant."""

    model_config = ConfigDict(populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class SamplingFields(BaseModel):
    """Sampler settings shared by every generation route; unset ones take the defaults
    of `SamplingParams` (llama.cpp's), so each default is declared in one place."""

    # Clients such as SillyTavern send many fields of other servers: the ones that mean
    # ours are renamed (dialects.py), the rest accepted and ignored.
    model_config = ConfigDict(extra="ignore")
    ALIASES: ClassVar[dialects.Aliases] = dialects.SAMPLING_ALIASES

    model: str | None = None
    n: int = Field(1, description="completions to return for the prompt")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = Field(
        None, description="a list of strings, or one JSON-encoded in a string"
    )
    top_n_sigma: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    logit_bias: dict[str, float | bool] | list[Any] | None = Field(
        None,
        description="token id → bias added to its logit (-100 or false bans it); or, as"
        " llama.cpp takes it, a list of [token id or text, bias or false] pairs",
    )
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(None, description="GBNF grammar the output must match")
    json_schema: dict[str, Any] | None = Field(
        None, description="JSON schema the output must match (llama.cpp's extension)"
    )
    guided_regex: str | None = Field(
        None, description="regular expression the whole output must match (vLLM's field)"
    )
    guided_grammar: str | None = Field(
        None,
        description="grammar the output must match, in llguidance's Lark syntax (a `start:`"
        " rule or `%llguidance`), or else GBNF (vLLM's field)",
    )
    # Choosing between branches (docs/design.md, "Choosing between branches").
    banned_strings: list[str] | None = Field(
        None,
        description="phrases no choice may contain: a branch that writes one is taken back"
        " to the token where it began, which is banned there, and samples again",
    )
    banned_strings_case_sensitive: bool | None = Field(
        None, description="match banned_strings and banned_regex with case (default: without)"
    )
    banned_regex: list[str] | None = Field(
        None,
        description="patterns (RE2 syntax) no choice may match, with the guarantees of"
        " banned_strings: a branch that writes a match is taken back to the token where it"
        " began, which is banned there; a stream never shows any part of a match",
    )
    distinct_openings: bool | None = Field(
        None, description="every choice of a prompt starts with a different first token"
    )
    choices_params: list[dict[str, Any]] | None = Field(
        None,
        description="per-choice sampler settings: entry i overrides the request's own for"
        " choice i (temperature, top_p, min_p, xtc_probability, ...)",
    )
    best_of: int | None = Field(
        None,
        description="branches to decode (n to --max-n); the n with the highest mean token"
        " logprob are returned, best first; not with stream",
    )

    @model_validator(mode="before")
    @classmethod
    def _dialects(cls, data: object) -> object:
        return dialects.canonical(data, cls.ALIASES) if isinstance(data, dict) else data

    @field_validator("dry_sequence_breakers", mode="before")
    @classmethod
    def _breakers(cls, value: object) -> object:
        return dialects.sequence_breakers(value)

    @field_validator("top_k", "seed", mode="before")
    @classmethod
    def _off_sentinels(cls, value: object, info: ValidationInfo) -> object:
        return dialects.off_sentinel(info.field_name, value)

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams from the fields the client set; raises ParamError when out of range."""
        values = {
            name: getattr(self, name)
            for name in SAMPLING_FIELDS & self.model_fields_set
            if getattr(self, name) is not None
        }
        if isinstance(self.stop, str):
            values["stop"] = (self.stop,)
        elif self.stop is not None:
            values["stop"] = tuple(self.stop)
        if self.dry_sequence_breakers is not None:
            values["dry_sequence_breakers"] = tuple(self.dry_sequence_breakers)
        if self.banned_strings is not None:
            values["banned_strings"] = tuple(self.banned_strings)
        if self.banned_regex is not None:
            values["banned_regex"] = tuple(self.banned_regex)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(**values)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


RawPrompt = str | list[str] | list[int] | list[list[int]]


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _prompt_shape(value: object) -> object:
    # One clear message instead of one error per member of the union.
    if isinstance(value, str) or _is_token_list(value):
        return value
    if isinstance(value, list) and (
        all(isinstance(p, str) for p in value) or all(_is_token_list(p) for p in value)
    ):
        return value
    raise ValueError(
        "prompt must be a string, a list of strings, a list of token ids,"
        " or a list of token-id lists"
    )


# `prompt` of /v1/completions and /completion: a text, token ids, or a list of either.
PromptField = Annotated[RawPrompt, BeforeValidator(_prompt_shape)]

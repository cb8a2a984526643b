"""Pydantic models of the OpenAI API as this server speaks it (requests, responses, chunks)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llama_srb.sampling.params import SamplingParams

_SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Sampler settings shared by every generation route; unset ones take the defaults
    of `SamplingParams` (llama.cpp's), so each default is declared in one place."""

    # Clients such as SillyTavern send many fields of other servers: accept, ignore.
    model_config = ConfigDict(extra="ignore")

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
    dry_sequence_breakers: list[str] | None = None
    top_n_sigma: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams from the fields the client set; raises ParamError when out of range."""
        values = {
            name: getattr(self, name)
            for name in _SAMPLING_FIELDS & self.model_fields_set
            if getattr(self, name) is not None
        }
        if isinstance(self.stop, str):
            values["stop"] = (self.stop,)
        elif self.stop is not None:
            values["stop"] = tuple(self.stop)
        if self.dry_sequence_breakers is not None:
            values["dry_sequence_breakers"] = tuple(self.dry_sequence_breakers)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(**values)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str = Field(..., description="the text to continue")
    max_tokens: int | None = Field(16, description="tokens to generate per choice")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llama-srb"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

"""Pydantic models of OpenAI's completions API (request and response) and of /v1/models."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.sampling import PromptField, SamplingFields
from llama_srb.sampling.params import SamplingParams


class CompletionRequest(SamplingFields):
    ALIASES: ClassVar[dialects.Aliases] = dialects.COMPLETION_ALIASES

    prompt: PromptField = Field(
        ...,
        description="the text to continue: a string, a token-id list, or a list of either"
        " (each prompt gets n choices)",
    )
    max_tokens: int | None = Field(
        None, description=f"tokens to generate per choice (default {SamplingParams.max_tokens})"
    )
    echo: bool = Field(False, description="return the prompt before the completion")
    logprobs: int | None = Field(
        None, description="log-probabilities of each token and of this many alternatives"
    )
    return_progress: bool = Field(
        False,
        description="llama.cpp's: with stream, events with `prompt_progress` {total, cache,"
        " processed, time_ms} while the prompt is read, the last one just before the first"
        " tokens",
    )


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens forked from the prefix cache, not computed


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "dropped"] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """OpenAI's model card, with what llama.cpp's router (`status`) and TabbyAPI
    (`parameters`) add, and our own `state` and `error` (api/models.py)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "llama-srb"
    status: dict[str, Any] = Field(default_factory=dict)  # {"value": "loaded", ...}
    state: str = "loaded"  # loaded, loading, unloading, sleeping, available or failed
    error: str | None = None  # why its last load failed
    parameters: dict[str, int] = Field(default_factory=dict)  # max_seq_len, once loaded


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# text-generation-webui's model info (routes/models.py).


class OobaModelInfo(BaseModel):
    model_name: str
    lora_names: list[str] = Field(default_factory=list)

"""Pydantic models of OpenAI's chat completions API (requests and responses)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.completions import Usage
from llama_srb.api.schemas.sampling import SamplingFields


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | None = Field(None, description="a string, or a list of text parts")
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: object) -> object:
        # Templates differ in how they take a list of parts; every one takes a string.
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ValueError("content parts must be text parts: {type: text, text: ...}")
            if not isinstance(part.get("text"), str):
                raise ValueError("a text part needs `text`, a string")
            texts.append(part["text"])
        return "\n".join(texts)


class ChatRequest(SamplingFields):
    ALIASES: ClassVar[dialects.Aliases] = dialects.CHAT_ALIASES

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(
        None, description="tokens to generate per choice (default: what fits in the context)"
    )
    max_completion_tokens: int | None = Field(None, description="max_tokens' newer name")
    logprobs: bool = Field(False, description="log-probability of each generated token")
    top_logprobs: int | None = Field(
        None, description="alternatives per token, with their log-probabilities (0-20)"
    )


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobOut] | None
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "dropped"] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage

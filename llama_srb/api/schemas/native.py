"""llama.cpp's own completion API (`POST /completion`), as its server's README and code
name the fields: what SillyTavern's "llama.cpp" API type and Mikupad's default mode send."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.sampling import PromptField, SamplingFields


class NativeCompletionRequest(SamplingFields):
    ALIASES: ClassVar[dialects.Aliases] = dialects.NATIVE_ALIASES

    prompt: PromptField = Field(
        ...,
        description="the text to continue: a string, a token-id list, or a list of either"
        " (each prompt gets n results)",
    )
    n_predict: int | None = Field(
        None,
        description="tokens to generate per result; -1 (the default): what fits in the"
        " context, shared by the n results, up to 2048",
    )
    n_probs: int = Field(
        0, description="the most likely tokens to report for each generated token (0-20)"
    )
    post_sampling_probs: bool = Field(
        False, description="report probabilities (`prob`, `top_probs`) instead of logprobs"
    )
    samplers: list[str] | str | None = Field(
        None,
        description="the samplers to use, by llama.cpp's names or letters; the chain keeps"
        " llama.cpp's default order",
    )
    cache_prompt: bool = Field(True, description="accepted; the prefix cache is always used")
    return_tokens: bool = Field(False, description="each result's token ids in `tokens`")
    return_progress: bool = Field(
        False,
        description="llama.cpp's: with stream, events with `prompt_progress` {total, cache,"
        " processed, time_ms} while the prompt is read, the last one just before the first"
        " tokens",
    )

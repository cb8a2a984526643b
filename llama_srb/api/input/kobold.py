"""KoboldCpp's generate fields → the prompt's tokens and SamplingParams, as koboldcpp.py
(`generate`) and its sampler (gpttype_adapter.cpp `SampleLogits`) read them.

- The context: `max_context_length`, at most the server's; `max_length` is lowered to leave
  the prompt at least 16 tokens of it, as KoboldCpp does.
- The prompt: `memory` first, always kept, then as much of the prompt's end as fits in the
  context beside `max_length` (KoboldCpp cuts the beginning rather than refuse) and beside
  every branch's tokens in the KV cache.
- The samplers: DRY first, then `sampler_order`'s ids in their order (the ones left out
  do not run; min-p runs with top-p), XTC last, as KoboldCpp's chain.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from llama_srb.api.errors import APIError
from llama_srb.api.input.params import request_params
from llama_srb.api.input.prompts import MAX_BYTES_PER_TOKEN, Prompt, tokenize_text
from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.kobold import (
    KOBOLD_DEFAULTS,
    SAMPLER_IDS,
    KoboldGenerateRequest,
)
from llama_srb.native import Model
from llama_srb.sampling.params import SamplingParams
from llama_srb.served import Tokenizer

DEFAULT_SAMPLER_ORDER = (6, 0, 1, 3, 4, 2, 5)  # koboldcpp.py's default
KOBOLD_LOGPROBS = 5  # alternatives per token (koboldcpp.py's logprobs_max)


def kobold_budget(body: KoboldGenerateRequest, n_ctx: int) -> tuple[int, int]:
    """(context, max_length): the request's context and the tokens each result may take."""
    context = min(body.max_context_length or n_ctx, n_ctx)
    reserve = max(1, min(context - 4, 16))
    return context, min(body.max_length, max(1, context - reserve))


def kobold_prompt(body: KoboldGenerateRequest, model: Tokenizer, n_ctx: int) -> Prompt:
    """`memory` + the end of `prompt` that fits (the BOS first, where the model wants one)."""
    context, max_length = kobold_budget(body, n_ctx)
    room = min(context - max_length, n_ctx - body.n * max_length)
    if room < 1:
        raise APIError(
            400,
            f"n={body.n} results × max_length={max_length} leave no room for the prompt in"
            f" this server's context of {n_ctx} tokens; lower n or max_length",
            param="max_length",
            code="context_length_exceeded",
        )
    head = [model.bos] if model.add_bos and model.bos >= 0 else []
    if body.memory:
        head += tokenize_text(model, body.memory, n_ctx, "memory", add_special=False)
    keep = room - len(head)
    if keep < 0:
        raise APIError(
            400,
            f"the memory takes {len(head)} tokens; the context leaves {room} for the prompt",
            param="memory",
            code="context_length_exceeded",
        )
    # Only the end can be kept: the rest is never tokenized.
    tail = body.prompt[-keep * MAX_BYTES_PER_TOKEN :] if keep else ""
    text = model.tokenize(tail, add_special=False, parse_special=True) if tail else []
    tokens = head + (text[-keep:] if keep else [])
    return Prompt(tokens, model.text(tokens))


def sampler_names(body: KoboldGenerateRequest) -> list[str]:
    """The chain's samplers, by llama.cpp's names, in KoboldCpp's order."""
    order = body.sampler_order if body.sampler_order is not None else DEFAULT_SAMPLER_ORDER
    sigma = ["top_n_sigma"] if body.top_n_sigma is not None else []
    return ["dry", *sigma, *(name for i in order for name in SAMPLER_IDS[i]), "xtc"]


def kobold_params(
    body: KoboldGenerateRequest, model: Model, n_ctx: int, max_length: int
) -> SamplingParams:
    """KoboldCpp's defaults for what the request leaves out, its token bans, its sampler
    order; the rest as every route reads it (input/params.py)."""
    unset: dict[str, Any] = {
        name: min(value, n_ctx) if name.endswith("last_n") else value
        for name, value in KOBOLD_DEFAULTS.items()
        if name not in body.model_fields_set
    }
    bans = body.token_bans()
    if bans:
        bias = body.logit_bias
        unset["logit_bias"] = (
            [*bias, *([int(k), False] for k in bans)]
            if isinstance(bias, list)
            else {**(bias or {}), **bans}
        )
    filled = body.model_copy(update=unset)
    logprobs = KOBOLD_LOGPROBS if body.logprobs else None
    params = request_params(filled, model, n_ctx, max_tokens=max_length, logprobs=logprobs)
    names = sampler_names(body)
    return dataclasses.replace(dialects.only_samplers(params, names), sampler_order=tuple(names))

"""llama.cpp's /completion fields → SamplingParams: `n_predict`, `n_probs` and the
`samplers` list (which turns off the samplers it leaves out and orders the rest)."""

from __future__ import annotations

import dataclasses

from llama_srb.api.input.params import request_params, with_default_length
from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.native import Model
from llama_srb.sampling.params import ParamError, SamplingParams

MAX_N_PROBS = 20  # as OpenAI's logprobs: each one is a sort of the vocabulary's top


def sampler_list(body: NativeCompletionRequest) -> list[str]:
    return dialects.sampler_names(body.samplers) if body.samplers is not None else []


def native_params(
    body: NativeCompletionRequest, model: Model, n_ctx: int, prompt_len: int
) -> SamplingParams:
    """SamplingParams from llama.cpp's fields: `n_predict` -1 (or none) is what fits in
    the context, shared by the n results, up to the chat default's cap; `samplers` turns
    off those it leaves out and orders the rest."""
    if not 0 <= body.n_probs <= MAX_N_PROBS:
        raise ParamError("n_probs", f"n_probs must be in [0, {MAX_N_PROBS}], got {body.n_probs}")
    if body.n_predict is not None and body.n_predict < -1:
        raise ParamError("n_predict", f"n_predict must be -1 or more, got {body.n_predict}")
    fits = body.n_predict is None or body.n_predict == -1  # what fits: sized below
    max_tokens = None if fits else body.n_predict
    logprobs = body.n_probs if body.n_probs > 0 else None
    params = request_params(body, model, n_ctx, max_tokens=max_tokens, logprobs=logprobs)
    if body.samplers is not None:
        names = sampler_list(body)
        params = dataclasses.replace(
            dialects.only_samplers(params, names), sampler_order=tuple(names)
        )
    return with_default_length(params, body, n_ctx, prompt_len) if fits else params

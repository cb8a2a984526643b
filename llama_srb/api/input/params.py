"""A request's fields → the engine's SamplingParams, per route: what each API calls its
token limit and logprobs, the default length (what fits), and the output constraints."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from llama_srb.api.input.constraints import grammar_for, logit_bias
from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.chat import ChatRequest
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.native import Model
from llama_srb.sampling.params import MAX_STOPS, ParamError, SamplingParams

# Without max_tokens a reply may take what fits in the context, up to this many tokens:
# each branch's tokens are reserved in the KV cache when its request is admitted, so an
# uncapped default would hold the whole context for one request and make the rest wait.
DEFAULT_MAX_TOKENS_CAP = 2048

MAX_N_PROBS = 20  # as OpenAI's logprobs: each one is a sort of the vocabulary's top


def request_params(
    body: SamplingFields, model: Model, n_ctx: int, **overrides: Any
) -> SamplingParams:
    """The request's SamplingParams, its constraints included; ParamError when invalid."""
    params = body.sampling_params(
        logit_bias=logit_bias(body.logit_bias, model.n_vocab, _text_tokens(model)),
        grammar=grammar_for(body),
        **overrides,
    )
    params.check_model_limits(model.n_vocab, n_ctx)
    return params


def _text_tokens(model: Model) -> Callable[[str], list[int]]:
    return lambda text: model.tokenize(text, add_special=False, parse_special=False)


def chat_params(
    body: ChatRequest, model: Model, prompt_len: int, n_ctx: int, stops: tuple[str, ...] = ()
) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise ParamError("top_logprobs", "top_logprobs needs logprobs: true")
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise ParamError(
            "top_logprobs", f"top_logprobs must be in [0, 20], got {body.top_logprobs}"
        )
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens(n_ctx, prompt_len, body.branches)
    params = request_params(body, model, n_ctx, max_tokens=max_tokens)
    # Chat's logprobs is a switch; the engine's is the number of alternatives (or None).
    k = (body.top_logprobs or 0) if body.logprobs else None
    # The template's end-of-turn text, for a model that does not know it as a token.
    extra = tuple(s for s in stops if s not in params.stop)[: MAX_STOPS - len(params.stop)]
    return dataclasses.replace(params, logprobs=k, stop=params.stop + extra)


def default_max_tokens(n_ctx: int, prompt_len: int, n: int) -> int:
    """What fits: the context left after the prompt, shared by the n branches, capped.
    At least 1, so that a prompt that leaves no room gets the context-length error."""
    fits = (n_ctx - prompt_len) // max(n, 1)
    return max(1, min(fits, DEFAULT_MAX_TOKENS_CAP))


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
    max_tokens = body.n_predict
    if max_tokens is None or max_tokens == -1:
        max_tokens = default_max_tokens(n_ctx, prompt_len, body.branches)
    logprobs = body.n_probs if body.n_probs > 0 else None
    params = request_params(body, model, n_ctx, max_tokens=max_tokens, logprobs=logprobs)
    if body.samplers is not None:
        names = sampler_list(body)
        params = dataclasses.replace(
            dialects.only_samplers(params, names), sampler_order=tuple(names)
        )
    return params

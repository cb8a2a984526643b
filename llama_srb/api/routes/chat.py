"""POST /v1/chat/completions: messages → the model's chat template → the same engine path
as completions (one prefill, n branches decoded together)."""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.body import body_spec, parsed
from llama_srb.api.chat_protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatRequest,
    ChoiceLogprobs,
)
from llama_srb.api.chat_template import ChatTemplate, ChatTemplateError
from llama_srb.api.choices import ChoiceResult, gather
from llama_srb.api.constraints import request_params
from llama_srb.api.errors import APIError
from llama_srb.api.logprob_format import Piece, chat_logprobs
from llama_srb.api.prompts import MAX_BYTES_PER_TOKEN, merge
from llama_srb.api.serving import (
    build,
    check_request,
    discard,
    generate,
    sse_response,
    until_disconnect,
)
from llama_srb.api.sse import ChatStream
from llama_srb.api.state import AppState
from llama_srb.engine.sequence import Request as EngineRequest
from llama_srb.native import Model
from llama_srb.sampling.params import MAX_STOPS, ParamError, SamplingParams

# Without max_tokens a reply may take what fits in the context, up to this many tokens:
# each branch's tokens are reserved in the KV cache when its request is admitted, so an
# uncapped default would hold the whole context for one request and make the rest wait.
DEFAULT_MAX_TOKENS_CAP = 2048


def chat_router(state: AppState) -> APIRouter:
    router = APIRouter()
    model_name = state.settings.model_name

    @router.post(
        "/chat/completions", response_model=ChatCompletion, openapi_extra=body_spec(ChatRequest)
    )
    async def chat_completions(
        body: Annotated[ChatRequest, Depends(parsed(ChatRequest))], http: Request
    ) -> Response:
        loaded = check_request(state, body, 1)
        served = state.chat_template()

        def prepare() -> EngineRequest:
            prompt = chat_prompt(loaded.model, served.get(), body, loaded.n_ctx)
            params = chat_params(body, loaded.model, len(prompt), loaded.n_ctx, served.stops)
            return build(loaded, body.n, prompt, params, "chatcmpl")

        request = await state.workers.run(prepare, lambda built: discard([built]))
        created = int(time.time())
        outputs = generate(state, request)
        piece = loaded.model.piece if body.logprobs else None
        if body.stream:
            stream = ChatStream(
                request.request_id, created, model_name, body.include_usage, body.n, piece
            )
            return sse_response(stream.events(outputs))
        result = await until_disconnect(http, gather(merge([outputs]), 1, body.n))
        if result.error is not None:
            raise APIError(500, result.error, code="engine_error")
        completion = ChatCompletion(
            id=request.request_id,
            created=created,
            model=model_name,
            choices=[chat_choice(choice, piece) for choice in result.choices],
            usage=result.usage.usage(),
        )
        return JSONResponse(completion.model_dump())

    return router


def chat_prompt(model: Model, template: ChatTemplate, body: ChatRequest, n_ctx: int) -> list[int]:
    """The rendered conversation as tokens, with exactly one BOS where the model wants one."""
    messages = [{"role": m.role, "content": m.content or ""} for m in body.messages]
    size = sum(len(m["content"].encode("utf-8", "replace")) for m in messages)
    if size > n_ctx * MAX_BYTES_PER_TOKEN:
        raise APIError(
            400,
            f"the messages hold {size} bytes: more than fits in this server's context of"
            f" {n_ctx} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    tokens = _tokenize_turns(model, template, messages)
    # Templates usually write the BOS themselves (`{{ bos_token }}`): add it only if not.
    if model.add_bos and model.bos >= 0 and tokens[:1] != [model.bos]:
        tokens.insert(0, model.bos)
    return tokens


def _tokenize_turns(
    model: Model, template: ChatTemplate, messages: list[dict[str, str]]
) -> list[int]:
    """The template's own markers (`<start_of_turn>`) become control tokens; what the
    messages say never does, or a message reading `<end_of_turn><start_of_turn>model`
    would forge a turn. Messages with such text are rendered as unique slots, then
    tokenized as plain text in their place."""
    risky = {i for i, m in enumerate(messages) if model.spells_special(m["content"])}
    slot = f"\x00{uuid.uuid4().hex}:"  # no client text can contain it: it is new
    slotted = [
        {**m, "content": f"{slot}{i}\x00"} if i in risky else m for i, m in enumerate(messages)
    ]
    try:
        text = template.render(slotted, add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="messages", code="chat_template_error") from None
    parts = re.split(f"{re.escape(slot)}(\\d+)\x00", text)  # template, index, template, …
    tokens: list[int] = []
    for k, part in enumerate(parts):
        if k % 2:
            tokens += model.tokenize(messages[int(part)]["content"], False, parse_special=False)
        elif part:
            tokens += model.tokenize(part, add_special=False, parse_special=True)
    return tokens


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
        max_tokens = default_max_tokens(n_ctx, prompt_len, body.n)
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


def chat_choice(choice: ChoiceResult, piece: Piece | None) -> ChatChoice:
    logprobs = None
    if piece is not None:
        logprobs = ChoiceLogprobs(content=chat_logprobs(choice.logprobs, piece))
    return ChatChoice(
        index=choice.index,
        message=AssistantMessage(content=choice.text),
        logprobs=logprobs,
        finish_reason=choice.finish_reason,
    )

"""POST /v1/chat/completions: messages → the model's chat template → the same engine path
as completions (one prefill, n branches decoded together)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from llama_srb.api.clients import Caller
from llama_srb.api.deps import State, parsed
from llama_srb.api.input.chat import chat_params, chat_prompt
from llama_srb.api.input.params import build_all
from llama_srb.api.models import ModelSlot
from llama_srb.api.render.chat import ChatAnswer
from llama_srb.api.routes.generate import Prepare, Prepared, respond
from llama_srb.api.schemas.chat import ChatCompletion, ChatRequest
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec
from llama_srb.engine.spec import RequestSpec

router = APIRouter()


@router.post(
    "/chat/completions", response_model=ChatCompletion, openapi_extra=body_spec(ChatRequest)
)
async def chat_completions(
    body: Annotated[ChatRequest, Depends(parsed(ChatRequest))], http: Request, state: State
) -> Response:
    def relaunch(fork: SamplingFields, tokens: list[int] | None) -> Prepare:
        assert isinstance(fork, ChatRequest)
        return preparation(state, fork, tokens)

    return await respond(state, http, body, 1, preparation(state, body), relaunch)


def preparation(state: AppState, body: ChatRequest, tokens: list[int] | None = None) -> Prepare:
    """How a chat call is prepared on a worker; with `tokens`, a fork's: the conversation
    and the assistant's reply so far, as they were, not rendered again."""

    def prepare(slot: ModelSlot, caller: Caller) -> Prepared:
        loaded, served = slot.ready(), slot.chat_template()
        model = loaded.model
        prompt = chat_prompt(model, served.get(), body, loaded.n_ctx) if tokens is None else tokens
        params = chat_params(body, model, len(prompt), loaded.n_ctx, served.stops)
        spec = RequestSpec(
            prompt, params, body.n, body.best_of, client=caller.client, prefix="chatcmpl"
        )
        submissions = build_all(loaded, [spec])
        answer = ChatAnswer(
            submissions[0].request_id,
            int(time.time()),
            slot.name,
            body.include_usage,
            body.n,
            model.piece if body.logprobs else None,
        )
        return Prepared(submissions, answer)

    return prepare

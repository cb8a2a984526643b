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
from llama_srb.api.render.chat import ChatAnswer
from llama_srb.api.routes.generate import Prepared, respond
from llama_srb.api.schemas.chat import ChatCompletion, ChatRequest
from llama_srb.api.workers import body_spec
from llama_srb.engine.spec import RequestSpec
from llama_srb.loader import LoadedEngine

router = APIRouter()


@router.post(
    "/chat/completions", response_model=ChatCompletion, openapi_extra=body_spec(ChatRequest)
)
async def chat_completions(
    body: Annotated[ChatRequest, Depends(parsed(ChatRequest))], http: Request, state: State
) -> Response:
    served = state.chat_template()

    def prepare(loaded: LoadedEngine, caller: Caller) -> Prepared:
        model = loaded.model
        prompt = chat_prompt(model, served.get(), body, loaded.n_ctx)
        params = chat_params(body, model, len(prompt), loaded.n_ctx, served.stops)
        spec = RequestSpec(
            prompt, params, body.n, body.best_of, client=caller.client, prefix="chatcmpl"
        )
        submissions = build_all(loaded, [spec])
        answer = ChatAnswer(
            submissions[0].request_id,
            int(time.time()),
            state.settings.model_name,
            body.include_usage,
            body.n,
            model.piece if body.logprobs else None,
        )
        return Prepared(submissions, answer)

    return await respond(state, http, body, 1, prepare)

"""POST /v1/chat/completions: messages → the model's chat template → the same engine path
as completions (one prefill, n branches decoded together)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.errors import APIError
from llama_srb.api.input.chat import chat_params, chat_prompt
from llama_srb.api.input.params import build, discard
from llama_srb.api.render.chat import ChatStream, chat_choice
from llama_srb.api.render.choices import gather
from llama_srb.api.render.sse import sse_response
from llama_srb.api.schemas.chat import ChatCompletion, ChatRequest
from llama_srb.api.service import check_request, submit, until_disconnect
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec, parsed
from llama_srb.engine.sequence import Request as EngineRequest


def chat_router(state: AppState) -> APIRouter:
    router = APIRouter()
    model_name = state.settings.model_name

    @router.post(
        "/chat/completions", response_model=ChatCompletion, openapi_extra=body_spec(ChatRequest)
    )
    async def chat_completions(
        body: Annotated[ChatRequest, Depends(parsed(ChatRequest))], http: Request
    ) -> Response:
        caller = state.caller(http)
        loaded = check_request(state, body, 1, caller)
        served = state.chat_template()

        def prepare() -> EngineRequest:
            prompt = chat_prompt(loaded.model, served.get(), body, loaded.n_ctx)
            params = chat_params(body, loaded.model, len(prompt), loaded.n_ctx, served.stops)
            return build(loaded, body.n, prompt, params, "chatcmpl", best_of=body.best_of)

        request = await state.workers.run(prepare, lambda built: discard([built]))
        created = int(time.time())
        outputs = submit(state, [request], caller)
        piece = loaded.model.piece if body.logprobs else None
        if body.stream:
            stream = ChatStream(
                request.request_id, created, model_name, body.include_usage, body.n, piece
            )
            return sse_response(stream.events(outputs))
        result = await until_disconnect(http, gather(outputs, 1, body.n))
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

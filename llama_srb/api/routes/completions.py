"""POST /v1/completions and GET /v1/models."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.errors import APIError
from llama_srb.api.protocol import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
)
from llama_srb.api.serving import generate, prepare, sse_response, until_disconnect
from llama_srb.api.sse import CompletionStream, collect_outputs
from llama_srb.api.state import AppState


def completions_router(state: AppState) -> APIRouter:
    router = APIRouter()
    model_name = state.settings.model_name

    @router.get("/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=state.created)])

    @router.post("/completions", response_model=Completion)
    async def completions(body: CompletionRequest, http: Request) -> Response:
        params = body.sampling_params()
        prompt = state.ready().model.tokenize(body.prompt)
        request = prepare(state, body, prompt, params, prefix="cmpl")
        created = int(time.time())
        outputs = generate(state, request)
        if body.stream:
            stream = CompletionStream(request.request_id, created, model_name, body.include_usage)
            return sse_response(stream.events(outputs))
        result = await until_disconnect(http, collect_outputs(outputs, body.n))
        if result.error is not None:
            raise APIError(500, result.error, code="engine_error")
        completion = Completion(
            id=request.request_id,
            created=created,
            model=model_name,
            choices=[
                CompletionChoice(index=i, text=text, finish_reason=reason)
                for i, (text, reason) in enumerate(zip(result.texts, result.reasons, strict=True))
            ],
            usage=Usage(
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                total_tokens=result.prompt_tokens + result.completion_tokens,
            ),
        )
        return JSONResponse(completion.model_dump())

    return router

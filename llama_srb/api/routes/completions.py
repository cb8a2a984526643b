"""POST /v1/completions: a prompt or a list of prompts, n choices each."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.errors import APIError
from llama_srb.api.input.params import build_all, discard, request_params
from llama_srb.api.input.prompts import Prompt, count_prompts, parse_prompts
from llama_srb.api.render.choices import gather
from llama_srb.api.render.completions import CompletionStream, completion_choices
from llama_srb.api.render.progress import PromptProgress
from llama_srb.api.render.sse import sse_response
from llama_srb.api.schemas.completions import Completion, CompletionRequest
from llama_srb.api.service import check_request, submit, until_disconnect
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec, parsed
from llama_srb.engine.sequence import Request as EngineRequest


def completions_router(state: AppState) -> APIRouter:
    router = APIRouter()
    model_name = state.settings.model_name

    @router.post(
        "/completions", response_model=Completion, openapi_extra=body_spec(CompletionRequest)
    )
    async def completions(
        body: Annotated[CompletionRequest, Depends(parsed(CompletionRequest))], http: Request
    ) -> Response:
        loaded = check_request(state, body, count_prompts(body.prompt))
        model = loaded.model
        scored = body.echo and body.logprobs is not None  # the prompt's logprobs too

        def prepare() -> tuple[list[Prompt], list[EngineRequest]]:
            params = request_params(body, model, loaded.n_ctx, logprobs=body.logprobs)
            prompts = parse_prompts(body.prompt, model, loaded.n_ctx)
            return prompts, build_all(loaded, body.n, prompts, params, "cmpl", scored, body.best_of)

        prompts, requests = await state.workers.run(prepare, lambda built: discard(built[1]))
        request_id, created = requests[0].request_id, int(time.time())
        outputs = submit(state, requests)
        piece = model.piece if body.logprobs is not None else None
        if body.stream:
            stream = CompletionStream(
                request_id,
                created,
                model_name,
                body.include_usage,
                body.n,
                piece,
                prompts=prompts,
                echo=body.echo,
                progress=PromptProgress() if body.return_progress else None,
            )
            return sse_response(stream.events(outputs))
        result = await until_disconnect(http, gather(outputs, len(prompts), body.n))
        if result.error is not None:
            raise APIError(500, result.error, code="engine_error")
        completion = Completion(
            id=request_id,
            created=created,
            model=model_name,
            choices=completion_choices(result, prompts, body, piece),
            usage=result.usage.usage(),
        )
        return JSONResponse(completion.model_dump())

    return router

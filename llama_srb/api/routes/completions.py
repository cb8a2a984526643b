"""POST /v1/completions (a prompt or a list of prompts, n choices each) and GET /v1/models."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.body import body_spec, parsed
from llama_srb.api.choices import ChoiceResult, Gathered, gather
from llama_srb.api.constraints import request_params
from llama_srb.api.errors import APIError
from llama_srb.api.logprob_format import Piece, completion_logprobs, concat
from llama_srb.api.prompts import Prompt, build_all, count_prompts, merge, parse_prompts
from llama_srb.api.protocol import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from llama_srb.api.serving import (
    check_request,
    discard,
    generate,
    sse_response,
    until_disconnect,
)
from llama_srb.api.sse import CompletionStream
from llama_srb.api.state import AppState
from llama_srb.engine.sequence import Request as EngineRequest
from llama_srb.sampling.logprobs import TokenLogprob


def completions_router(state: AppState) -> APIRouter:
    router = APIRouter()
    model_name = state.settings.model_name

    @router.get("/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, created=state.created)])

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
            return prompts, build_all(loaded, body.n, prompts, params, "cmpl", scored)

        prompts, requests = await state.workers.run(prepare, lambda built: discard(built[1]))
        request_id, created = requests[0].request_id, int(time.time())
        outputs = merge([generate(state, request) for request in requests])
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


def completion_choices(
    result: Gathered, prompts: list[Prompt], body: CompletionRequest, piece: Piece | None
) -> list[CompletionChoice]:
    choices = []
    for choice in result.choices:
        position = choice.index // body.n
        prompt = prompts[position]
        scores = result.prompt_logprobs[position] if body.echo else None
        choices.append(
            CompletionChoice(
                index=choice.index,
                text=prompt.text + choice.text if body.echo else choice.text,
                logprobs=_logprobs(choice, prompt, scores, piece) if piece else None,
                finish_reason=choice.finish_reason,
            )
        )
    return choices


def _logprobs(
    choice: ChoiceResult,
    prompt: Prompt,
    scores: list[TokenLogprob | None] | None,
    piece: Piece,
) -> CompletionLogprobs:
    """The choice's tokens (after the prompt's, with echo), offsets into prompt + text."""
    generated = [(e.token, e) for e in choice.logprobs]
    tail = completion_logprobs(generated, piece, len(prompt.text))[0]
    if scores is None:
        return tail
    head = completion_logprobs(list(zip(prompt.tokens, scores, strict=True)), piece, 0)[0]
    return concat(head, tail)

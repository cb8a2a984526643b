"""POST /v1/completions: a prompt or a list of prompts, n choices each."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from llama_srb.api.clients import Caller
from llama_srb.api.deps import State, parsed
from llama_srb.api.input.params import build_all, request_params
from llama_srb.api.input.prompts import Prompt, count_prompts, parse_prompts
from llama_srb.api.models import ModelSlot
from llama_srb.api.render.completions import CompletionAnswer
from llama_srb.api.render.progress import PromptProgress
from llama_srb.api.routes.generate import Prepare, Prepared, respond
from llama_srb.api.schemas.completions import Completion, CompletionRequest
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec
from llama_srb.engine.spec import RequestSpec

router = APIRouter()


@router.post("/completions", response_model=Completion, openapi_extra=body_spec(CompletionRequest))
async def completions(
    body: Annotated[CompletionRequest, Depends(parsed(CompletionRequest))],
    http: Request,
    state: State,
) -> Response:
    def relaunch(fork: SamplingFields, tokens: list[int] | None) -> Prepare:
        assert isinstance(fork, CompletionRequest)
        return preparation(state, fork, tokens)

    prepare = preparation(state, body)
    return await respond(state, http, body, count_prompts(body.prompt), prepare, relaunch)


def preparation(
    state: AppState, body: CompletionRequest, tokens: list[int] | None = None
) -> Prepare:
    """How a completions call is prepared on a worker; with `tokens`, a fork's: that one
    prompt (its text is the choice's, which a fork's answer does not repeat)."""
    scored = body.echo and body.logprobs is not None  # the prompt's logprobs too

    def prepare(slot: ModelSlot, caller: Caller) -> Prepared:
        loaded = slot.ready()
        model = loaded.model
        params = request_params(body, model, loaded.n_ctx, logprobs=body.logprobs)
        prompts = (
            parse_prompts(body.prompt, model, loaded.n_ctx)
            if tokens is None
            else [Prompt(tokens, "")]
        )
        specs = [
            RequestSpec(p.tokens, params, body.n, body.best_of, scored, caller.client, "cmpl")
            for p in prompts
        ]
        submissions = build_all(loaded, specs)
        answer = CompletionAnswer(
            submissions[0].request_id,
            int(time.time()),
            slot.name,
            body.include_usage,
            body.n,
            model.piece if body.logprobs is not None else None,
            prompts=prompts,
            echo=body.echo,
            progress=PromptProgress() if body.return_progress else None,
        )
        return Prepared(submissions, answer)

    return prepare

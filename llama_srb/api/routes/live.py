"""Live branching: fork, drop and steer one choice of a call while it streams.

- `POST …/{id}/choices/{index}/fork`: `n` new continuations of the choice from where it
  stands (or from `at`, a character offset into its text): an ordinary answer or stream.
  It is a new request whose prompt is the call's prompt and the choice's released tokens,
  so the scheduler forks their cells from the running branch (or the cache, once it ended).
- `DELETE …/{id}/choices/{index}`: the choice ends now (`finish_reason: "dropped"`); with
  `{"refill": true}` a fresh one from the same prompt goes on, on the same stream.
- `PATCH …/{id}/choices/{index}`: sampler fields for its next tokens, and `append`: the
  writer's words, taken into the branch as if the model had written them.

Under /v1/completions and /v1/chat/completions alike; `id` is the call's response id.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Annotated, Any, TypeVar, cast

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llama_srb.api.deps import State, parsed
from llama_srb.api.errors import APIError
from llama_srb.api.finite import check_finite
from llama_srb.api.input.params import ContextTooSmall
from llama_srb.api.live import LiveCall, fork_point
from llama_srb.api.routes.generate import Prepare, respond
from llama_srb.api.state import AppState
from llama_srb.engine.build import Built, build_refill, build_steer
from llama_srb.sampling.branch import BranchSampler
from llama_srb.sampling.params import BRANCH_FIELDS, SamplingParams, branch_overrides

router = APIRouter()
M = TypeVar("M", bound=BaseModel)

MAX_APPEND_CHARS = 4096  # a writer's nudge, not a chapter: that is a fork's prompt
# A fork continues the choice's text: these would ask for another prompt or answer shape.
NOT_FOR_FORKS = ("prompt", "messages", "echo", "suffix")


class ForkBody(BaseModel):
    """`at` and any field of the call's own body (for the children; unset: the call's)."""

    model_config = ConfigDict(extra="allow")
    at: int | None = Field(None, ge=0, description="a character offset into the choice's text")


class DropBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    refill: bool = Field(False, description="a fresh choice from the same prompt takes its place")


class SteerBody(BaseModel):
    """Sampler fields (those `choices_params` takes) and the writer's words."""

    model_config = ConfigDict(extra="allow")
    append: str | None = Field(None, max_length=MAX_APPEND_CHARS)


def _call_of(state: AppState, http: Request, response_id: str) -> LiveCall:
    """The caller's own call (a 404 for anyone else's)."""
    return state.live.get(response_id, state.caller(http).client)


@router.post("/completions/{response_id}/choices/{index}/fork")
@router.post("/chat/completions/{response_id}/choices/{index}/fork")
async def fork(
    response_id: str,
    index: int,
    body: Annotated[ForkBody, Depends(parsed(ForkBody))],
    http: Request,
    state: State,
) -> Response:
    call = _call_of(state, http, response_id)
    position, _ = call.locate(index)
    changes = dict(body.model_extra or {})
    for name in NOT_FOR_FORKS:
        if name in changes:
            raise APIError(400, f"a fork continues the choice's text: `{name}` is the call's", name)
    tokens, text = call.text_of(index)
    prompt = call.specs[position].prompt
    async with state.use(call.model) as slot:
        model = slot.ready().model
        head = await state.workers.run(lambda: fork_point(model, tokens, text, body.at))
    # The body checked again for the children's fields, but not its prompt: thousands of
    # token ids (the call's, checked when it came, and its choice's own) took 2 to 8 ms of
    # the event loop to validate again for an 8,000-token story; they are set, not parsed.
    values = call.body.model_dump(exclude_unset=True, by_alias=True, exclude={"prompt"})
    values.update(changes)
    values["model"] = call.model  # the call's own, whichever model is current now
    values.pop("echo", None)  # the answer is what follows the fork point
    completions = "prompt" in type(call.body).model_fields  # its prompt: the fork's tokens
    if completions:
        values["prompt"] = prompt[:1]
    forked = _validated(type(call.body), values)
    if completions:
        forked = forked.model_copy(update={"prompt": prompt + head})
    prepare = cast(Prepare, call.relaunch(forked, prompt + head))
    try:
        return await respond(state, http, forked, 1, prepare, call.relaunch)
    except ContextTooSmall as exc:
        raise APIError(
            exc.status, _too_long(exc, index, len(prompt)), exc.param, exc.code
        ) from None


def _too_long(exc: ContextTooSmall, index: int, call_prompt: int) -> str:
    """A fork that cannot be in the context, in a fork's words: its prompt is shared with
    the call, but those cells are in this context all the same."""
    return (
        f"this fork needs {exc.need} tokens of context ({exc.prompt} in its prompt +"
        f" {exc.branches} branches × max_tokens={exc.max_tokens}) but the server has"
        f" {exc.n_ctx}: its prompt, the call's {call_prompt} tokens and choice {index}'s"
        f" {exc.prompt - call_prompt} up to the fork point, is shared with the call but"
        " fills the context all the same; fork from an earlier `at`, or lower n or max_tokens"
    )


@router.delete("/completions/{response_id}/choices/{index}")
@router.delete("/chat/completions/{response_id}/choices/{index}")
async def drop(response_id: str, index: int, http: Request, state: State) -> JSONResponse:
    call = _call_of(state, http, response_id)
    position, branch = call.locate(index)
    options = await _optional_body(http, DropBody)
    if options.refill and len(call.specs) > 1:
        raise APIError(400, "refill takes a call with one prompt", param="refill")
    async with state.use(call.model) as slot:
        loaded = slot.ready()
        refill = None
        if options.refill:
            params = call.specs[0].params
            seed = _seed(params, call.n + call.refills)
            refill = await state.workers.run(
                lambda: build_refill(loaded.model, params, seed), Built.close
            )
        refilled = await loaded.runtime.drop(call.request_ids[position], branch, refill)
    if refilled is not None:
        call.refilled(refilled)
    return JSONResponse(
        {"id": response_id, "index": index, "finish_reason": "dropped", "refill": refilled}
    )


@router.patch("/completions/{response_id}/choices/{index}")
@router.patch("/chat/completions/{response_id}/choices/{index}")
async def steer(
    response_id: str,
    index: int,
    body: Annotated[SteerBody, Depends(parsed(SteerBody))],
    http: Request,
    state: State,
) -> JSONResponse:
    call = _call_of(state, http, response_id)
    position, branch = call.locate(index)
    changes: dict[str, Any] = dict(body.model_extra or {})
    unknown = sorted(set(changes) - BRANCH_FIELDS)
    if unknown:
        raise APIError(
            400,
            f"`{unknown[0]}` cannot be steered: a running choice takes its sampler's fields"
            f" ({', '.join(sorted(BRANCH_FIELDS))}) and `append`",
            param=unknown[0],
        )
    if not changes and not body.append:
        raise APIError(400, "nothing to steer: send sampler fields or `append`")
    spec = call.specs[position]
    if body.append and spec.params.constraint is not None:
        raise APIError(
            400, "a constrained choice follows its grammar: it takes no `append`", "append"
        )
    # each value's type checked here, its range by SamplingParams (ParamError: a 400
    # naming the field), its model limits once the model is at hand
    steered = {**call.steered.get(index, {}), **dict(branch_overrides(changes))}
    params = (
        dataclasses.replace(spec.params.for_branch(branch), choices_params=(), **steered)
        if changes
        else None
    )

    def discard(built: tuple[Built[BranchSampler] | None, list[int]]) -> None:
        if built[0] is not None:
            built[0].close()

    async with state.use(call.model) as slot:
        loaded = slot.ready()
        if params is not None:
            params.check_model_limits(loaded.model.n_vocab, loaded.n_ctx)

        def build() -> tuple[Built[BranchSampler] | None, list[int]]:
            seed = _seed(spec.params, branch)
            sampler = build_steer(loaded.model, params, seed) if params else None
            words = body.append or ""
            return sampler, loaded.model.tokenize(words, add_special=False, parse_special=False)

        sampler, append = await state.workers.run(build, discard)
        await loaded.runtime.steer(call.request_ids[position], branch, sampler, append)
    call.steered[index] = steered
    return JSONResponse(
        {
            "id": response_id,
            "index": index,
            "steered": sorted(steered),
            "appended_tokens": len(append),
        }
    )


def _seed(params: SamplingParams, index: int) -> int:
    """A new chain's seed: the request's rule (seed + index) when it has one."""
    return params.seed + index if params.seed is not None else random.getrandbits(32)


async def _optional_body(http: Request, model: type[M]) -> M:
    """A body that may be left out (DELETE's): the model's defaults then."""
    raw = await http.body()
    if not raw.strip():
        return model()
    check_finite(raw)
    try:
        values = json.loads(raw)
    except ValueError:
        raise APIError(400, "the request body must be JSON") from None
    return _validated(model, values)


def _validated(model: type[M], values: object) -> M:
    """`values` as `model`, or a 400 that names the field (errors.api_error)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None

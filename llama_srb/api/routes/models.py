"""The models this server serves, and their loading and unloading (api/models.py), in the
shapes their clients read:

- GET /v1/models (OpenAI's list; llama.cpp's router adds each model's `status`, which we
  carry too, with our finer `state`) and llama-server's router routes: GET /models,
  POST /models/load and /models/unload (`{"model"}`; `{"success": true}` at once, the
  load or unload goes on in the background: poll /models).
- TabbyAPI's: GET /v1/model/list, GET /v1/model (the current model's card),
  POST /v1/model/load (`{"model_name"}`, answered as the load's progress stream),
  POST /v1/model/unload, GET /v1/auth/permission.

Loading and unloading are an admin's where keys are set (`admin:` keys: a writer's key
cannot unload another writer's model); TabbyAPI's clients send the key as `x-admin-key`
(api/auth.py reads it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from llama_srb.api.auth import KEY_ADMIN
from llama_srb.api.deps import State, parsed
from llama_srb.api.errors import APIError, api_error
from llama_srb.api.models import ModelSlot, ModelState
from llama_srb.api.render.sse import event, sse_response
from llama_srb.api.schemas.completions import ModelCard, ModelList, OobaModelInfo
from llama_srb.api.state import AppState
from llama_srb.api.workers import body_spec

router = APIRouter()
LOAD_PING_S = 5.0  # a keep-alive comment on TabbyAPI's load stream while a load runs

# llama.cpp's router's status words for ours (it has no unloading: still loaded until done)
ROUTER_STATUS = {
    ModelState.loaded: "loaded",
    ModelState.unloading: "loaded",
    ModelState.loading: "loading",
    ModelState.sleeping: "sleeping",
    ModelState.available: "unloaded",
    ModelState.failed: "unloaded",
}


class ModelRef(BaseModel):
    """llama-server's `{"model"}`; TabbyAPI's `{"model_name"}` (its old `name` too)."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(max_length=256, validation_alias=AliasChoices("model", "model_name", "name"))


class OptionalModelRef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = Field(
        None, max_length=256, validation_alias=AliasChoices("model", "model_name", "name")
    )


def card(state: AppState, slot: ModelSlot) -> ModelCard:
    status: dict[str, object] = {"value": ROUTER_STATUS[slot.state]}
    if slot.state is ModelState.failed:
        status["failed"] = True
    parameters = {"max_seq_len": slot.served.n_ctx} if slot.served is not None else {}
    return ModelCard(
        id=slot.name,
        created=state.created,
        status=status,
        state=slot.state.value,
        error=slot.error,
        parameters=parameters,
    )


def model_list(state: AppState) -> ModelList:
    state.models.scan()
    return ModelList(data=[card(state, slot) for slot in state.models.slots])


@router.get("/v1/models", response_model=ModelList)
@router.get("/models", response_model=ModelList)
@router.get("/v1/model/list", response_model=ModelList)
async def models(state: State) -> ModelList:
    return model_list(state)


@router.get("/v1/model", response_model=ModelCard)
async def current_model(state: State) -> ModelCard:
    """TabbyAPI's: the model loaded, or the one used last (SillyTavern shows its id)."""
    return card(state, state.models.current())


@router.get("/v1/internal/model/info", response_model=OobaModelInfo)
async def model_info(state: State) -> OobaModelInfo:
    """text-generation-webui's (SillyTavern's ooba type turns remote tokenization on)."""
    return OobaModelInfo(model_name=state.models.current().name)


def require_admin(state: AppState, http: Request) -> None:
    """Loading and unloading change what every writer gets: an admin's, where keys are set."""
    if state.keys.required and not http.scope.get("state", {}).get(KEY_ADMIN):
        raise APIError(
            403,
            "loading and unloading models takes an admin's key (`admin:name: key` in"
            " --api-key or --api-key-file)",
            code="admin_key_required",
        )


@router.post("/models/load", openapi_extra=body_spec(ModelRef))
async def load(
    body: Annotated[ModelRef, Depends(parsed(ModelRef))], http: Request, state: State
) -> JSONResponse:
    """llama-server's: starts the load and answers at once (poll /models)."""
    require_admin(state, http)
    slot = state.models.slot(body.model)
    if slot.served is not None or slot.loading is not None:
        raise APIError(400, f"model `{slot.name}` is already {slot.state.value}", "model")
    task = asyncio.create_task(state.models.load(slot))
    task.add_done_callback(_quiet)
    return JSONResponse({"success": True})


@router.post("/models/unload", openapi_extra=body_spec(ModelRef))
async def unload(
    body: Annotated[ModelRef, Depends(parsed(ModelRef))], http: Request, state: State
) -> JSONResponse:
    """llama-server's: starts the unload and answers at once; running requests get
    --unload-grace seconds."""
    require_admin(state, http)
    slot = state.models.slot(body.model)
    if slot.served is None:
        raise APIError(400, f"model `{slot.name}` is not loaded", "model")
    _unload_soon(state, slot)
    return JSONResponse({"success": True})


@router.post("/v1/model/load", openapi_extra=body_spec(ModelRef))
async def tabby_load(
    body: Annotated[ModelRef, Depends(parsed(ModelRef))], http: Request, state: State
) -> Response:
    """TabbyAPI's: the load as a stream of progress events (`module`/`modules`, `status`
    processing then finished), an error event if it fails. A load has no modules here:
    0 of 1 while it runs, 1 of 1 when done; a comment keeps the stream alive meanwhile.
    A client that leaves does not stop the load."""
    require_admin(state, http)
    slot = state.models.slot(body.model, param="model_name")
    task = asyncio.create_task(state.models.load(slot))
    task.add_done_callback(_quiet)
    return sse_response(_load_progress(task))


async def _load_progress(task: asyncio.Task[None]) -> AsyncIterator[str]:
    def progress(done: bool) -> str:
        status = "finished" if done else "processing"
        return event({"model_type": "model", "module": int(done), "modules": 1, "status": status})

    yield progress(False)
    while not task.done():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), LOAD_PING_S)
        if not task.done():
            yield ": loading\n\n"
    failure = task.exception()
    if failure is None:
        yield progress(True)
    else:
        error = api_error(failure)
        yield f"data: {json.dumps({'error': {'message': error.message, 'code': error.code}})}\n\n"


@router.post("/v1/model/unload")
async def tabby_unload(http: Request, state: State) -> JSONResponse:
    """TabbyAPI's (no body): unloads the current model, or the one `model_name` names;
    running requests get --unload-grace seconds."""
    require_admin(state, http)
    raw = await http.body()
    try:
        name = OptionalModelRef.model_validate_json(raw).model if raw.strip() else None
    except ValueError:
        raise APIError(400, 'the body is `{"model_name": "..."}` or empty') from None
    slot = state.models.slot(name, param="model_name") if name else state.models.current()
    if slot.served is None:
        raise APIError(503, "no model is loaded", code="model_not_loaded")
    _unload_soon(state, slot)
    return JSONResponse(None)


@router.get("/v1/auth/permission")
async def permission(http: Request, state: State) -> JSONResponse:
    """TabbyAPI's: what the caller's key may do (SillyTavern asks before admin actions)."""
    admin = not state.keys.required or bool(http.scope.get("state", {}).get(KEY_ADMIN))
    return JSONResponse({"permission": "admin" if admin else "api"})


def _unload_soon(state: AppState, slot: ModelSlot) -> None:
    why = "on an admin's request"
    task = asyncio.create_task(state.models.unload(slot, why, state.settings.unload_grace))
    task.add_done_callback(_quiet)


def _quiet(task: asyncio.Task[object]) -> None:
    """A load or unload started for a route that already answered: its failure is the
    slot's (shown by /v1/models) and in the log, not an unretrieved exception."""
    if not task.cancelled():
        task.exception()

"""The HTTP layer: routes, SSE, errors, auth and the model's lifespan.

Nothing here decodes: handlers validate, tokenize, build a Request and read its outputs
from the runtime. No module-level state; everything lives on `app.state`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from pathlib import Path
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llama_srb.api.errors import APIError, install_error_handlers
from llama_srb.api.metrics import EngineCollector
from llama_srb.api.protocol import (
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
)
from llama_srb.api.sse import CompletionStream, collect_outputs
from llama_srb.config import Settings
from llama_srb.engine.engine import build_request
from llama_srb.engine.loader import LoadedEngine, load_engine
from llama_srb.sampling.params import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class AppState:
    settings: Settings
    created: int = field(default_factory=lambda: int(time.time()))
    loaded: LoadedEngine | None = None
    load_error: str | None = None

    def ready(self) -> LoadedEngine:
        if self.loaded is None:
            detail = f": {self.load_error}" if self.load_error else ", try again shortly"
            raise APIError(503, f"the model is not loaded{detail}", code="model_loading")
        return self.loaded


def create_app(settings: Settings) -> FastAPI:
    state = AppState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load(state))
        try:
            yield
        finally:
            loader.cancel()
            if state.loaded is not None:
                await asyncio.to_thread(state.loaded.close)

    app = FastAPI(title="llama-srb", version="0.1.0", lifespan=lifespan)
    app.state.srb = state
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.loaded is None:
            status = "error" if state.load_error else "loading"
            return JSONResponse({"status": status, "error": state.load_error}, status_code=503)
        return JSONResponse({"status": "ok", "model": settings.model_name})

    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: state.loaded.engine if state.loaded else None))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(_v1_router(state))
    # The browser UI: static files, no build step; mounted last so API routes win.
    app.mount("/", StaticFiles(directory=Path(__file__).parent.parent / "web", html=True), name="web")
    return app


async def _load(state: AppState) -> None:
    try:
        state.loaded = await asyncio.to_thread(load_engine, state.settings)
    except Exception as exc:  # reported by /health and every route, not a crash
        log.exception("model load failed")
        state.load_error = f"{type(exc).__name__}: {exc}"


def _v1_router(state: AppState) -> APIRouter:
    settings = state.settings

    async def require_key(request: Request) -> None:
        if settings.api_key is None:
            return
        supplied = request.headers.get("authorization", "")
        expected = f"Bearer {settings.api_key}"
        if not secrets.compare_digest(supplied.encode(), expected.encode()):
            raise APIError(
                401,
                "missing or wrong API key: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
            )

    router = APIRouter(prefix="/v1", dependencies=[Depends(require_key)])

    @router.get("/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=settings.model_name, created=state.created)])

    @router.post("/completions", response_model=Completion)
    async def completions(body: CompletionRequest, http: Request) -> Response:
        engine = state.ready()
        _check_model(settings, body.model)
        _check_n(settings, body.n)
        params = body.sampling_params()
        prompt = engine.model.tokenize(body.prompt)
        _check_fits(engine.n_ctx, len(prompt), body.n, params)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        request = build_request(engine.model, request_id, prompt, params, body.n)
        outputs = engine.runtime.generate(request)
        created = int(time.time())
        if body.stream:
            stream = CompletionStream(request_id, created, settings.model_name, body.include_usage)
            return StreamingResponse(
                stream.events(outputs), media_type="text/event-stream", headers=_NO_BUFFERING
            )
        result = await _until_disconnect(http, collect_outputs(outputs, body.n))
        if result.error is not None:
            raise APIError(500, result.error, code="engine_error")
        return JSONResponse(
            Completion(
                id=request_id,
                created=created,
                model=settings.model_name,
                choices=[
                    CompletionChoice(index=i, text=text, finish_reason=reason)
                    for i, (text, reason) in enumerate(zip(result.texts, result.reasons, strict=True))
                ],
                usage=Usage(
                    prompt_tokens=result.prompt_tokens,
                    completion_tokens=result.completion_tokens,
                    total_tokens=result.prompt_tokens + result.completion_tokens,
                ),
            ).model_dump()
        )

    return router


_NO_BUFFERING = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _check_model(settings: Settings, name: str | None) -> None:
    if name and name != settings.model_name:
        raise APIError(
            404,
            f"model `{name}` is not served here; this server serves `{settings.model_name}`",
            param="model",
            code="model_not_found",
        )


def _check_n(settings: Settings, n: int) -> None:
    if not 1 <= n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}, got {n}", param="n")


def _check_fits(n_ctx: int, prompt_tokens: int, n: int, params: SamplingParams) -> None:
    if prompt_tokens == 0:
        raise APIError(400, "the prompt is empty", param="prompt")
    needed = prompt_tokens + n * params.max_tokens
    if needed > n_ctx:
        raise APIError(
            400,
            f"this request needs {needed} tokens of context ({prompt_tokens} in the prompt + "
            f"n={n} × max_tokens={params.max_tokens}) but the server has {n_ctx}; shorten the "
            "prompt or lower n or max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )


async def _until_disconnect(http: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so aborting its request) if the client leaves."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        raise APIError(499, "the client disconnected")
    return task.result()


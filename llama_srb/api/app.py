"""The HTTP app: lifespan (model loading), health, metrics, the /v1 routes and the UI.

Nothing here decodes: routes validate, tokenize, build a Request and read its outputs from
the runtime. No module-level state: everything lives on `app.state.srb`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import anyio.to_thread
from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llama_srb.api.deps import State
from llama_srb.api.errors import install_error_handlers
from llama_srb.api.metrics import (
    ConnectionsCollector,
    EngineCollector,
    ModelsCollector,
    WatchdogCollector,
)
from llama_srb.api.middleware import install_middleware
from llama_srb.api.models import Loader
from llama_srb.api.routes import (
    chat,
    completions,
    dialects,
    live,
    models,
    native,
    stories,
    tokenize,
)
from llama_srb.api.routes.kobold import kobold_router
from llama_srb.api.schemas.chat import ChatRequest
from llama_srb.api.schemas.completions import CompletionRequest
from llama_srb.api.schemas.kobold import KoboldGenerateRequest, TokenCountRequest
from llama_srb.api.schemas.native import NativeCompletionRequest
from llama_srb.api.schemas.tokens import (
    DecodeRequest,
    DetokenizeRequest,
    EncodeRequest,
    TokenizeRequest,
)
from llama_srb.api.state import AppState
from llama_srb.api.workers import document_bodies
from llama_srb.config import Settings
from llama_srb.served import Served
from llama_srb.stories.owners import Handover
from llama_srb.stories.schema import Duplicate, StoryDraft, StoryPatch

T = TypeVar("T")
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(settings: Settings, loader: Loader | None = None) -> FastAPI:
    """The app; `loader` loads a model (default: from its file; the unit tests' over a
    fake engine)."""
    state = AppState(settings, loader=loader)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # What the first requests would build, built while the model loads: anyio's
        # thread backend (imported by the first sync dependency: 58 ms of the first
        # request), and the OpenAPI document (FastAPI builds each route's handler on its
        # first match, ~40 ms of the first request; the request counter's labels read the
        # document's paths: ~170 ms of the event loop after the first response).
        await anyio.to_thread.run_sync(lambda: None)
        documented = asyncio.create_task(asyncio.to_thread(app.openapi))
        state.open_stories()
        loader = asyncio.create_task(state.run())
        try:
            yield
        finally:
            loader.cancel()
            await state.close()
            await documented

    app = FastAPI(title="llama-srb", version="0.1.0", lifespan=lifespan)
    app.state.srb = state
    install_error_handlers(app)
    # Without a key a client reaches only these: the probe, the scrape and the UI's files.
    open_paths = {"/health", "/metrics", "/", *(f"/{f.name}" for f in WEB_DIR.iterdir())}
    install_middleware(app, state, open_paths)

    @app.get("/health")
    async def health(state: State) -> JSONResponse:
        if state.engine_failure is not None:  # the process is about to exit
            return JSONResponse({"status": "error", "error": state.engine_failure}, 503)
        models = state.models
        if not models.loaded() and not models.default.loads:  # the first load: not serving yet
            error = models.default.error
            body: dict[str, object] = {"status": "error" if error else "loading", "error": error}
            return JSONResponse(body, status_code=503)
        step = state.stuck()
        if step is not None:  # a liveness probe restarts the replica
            error = (
                f"the engine has been in one step for {time.monotonic() - step.started:.0f} s"
                f" (over --stuck-after {state.settings.stuck_after:g} s)"
            )
            body = {"status": "stuck", "error": error, "requests": list(step.request_ids)}
            return JSONResponse(body, status_code=503)
        if state.draining:  # tell load balancers to stop sending work here
            return JSONResponse({"status": "draining"}, status_code=503)
        # Models load on demand: one sleeping or loading is still served (api/models.py).
        states = {slot.name: slot.state.value for slot in models.slots}
        return JSONResponse({"status": "ok", "model": models.current().name, "models": states})

    registry = state.metrics.registry
    registry.register(EngineCollector(lambda: _current(state, lambda s: s.snapshot())))
    registry.register(WatchdogCollector(lambda: _current(state, lambda s: s.watchdog)))
    registry.register(ConnectionsCollector(state.connections))
    registry.register(
        ModelsCollector(lambda: [(s.name, s.state.value, s.loads) for s in state.models.slots])
    )

    @app.get("/metrics")
    async def metrics(state: State) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1")
    routers = (completions, chat, live, tokenize, stories)
    for router in (module.router for module in routers):
        v1.include_router(router)
    app.include_router(v1)
    # The models, in OpenAI's, llama.cpp router's and TabbyAPI's shapes (/v1/models, ...).
    app.include_router(models.router)
    # llama.cpp's server has /tokenize and /detokenize at the root: tools call them there,
    # and its own completion API (/completion, /props).
    app.include_router(tokenize.router)
    app.include_router(native.router)
    # TabbyAPI's and text-generation-webui's model and token routes, under /v1.
    app.include_router(dialects.router)
    # KoboldCpp's API (KoboldAI Lite, Mikupad's KoboldCpp mode), under /api.
    app.include_router(kobold_router())
    document_bodies(
        app,
        [
            CompletionRequest,
            ChatRequest,
            TokenizeRequest,
            DetokenizeRequest,
            NativeCompletionRequest,
            StoryDraft,
            StoryPatch,
            Duplicate,
            Handover,
            EncodeRequest,
            DecodeRequest,
            KoboldGenerateRequest,
            TokenCountRequest,
        ],
    )
    # The browser UI: static files, no build step; mounted last so API routes win.
    app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app


def _current(state: AppState, read: Callable[[Served], T]) -> T | None:
    """What the metrics read of the engine of the model used last, if one is loaded."""
    slot = state.models.current()
    return read(slot.served) if slot.served is not None else None

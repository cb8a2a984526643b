"""The HTTP app: lifespan (model loading), health, metrics, the /v1 routes and the UI.

Nothing here decodes: routes validate, tokenize, build a Request and read its outputs from
the runtime. No module-level state: everything lives on `app.state.srb`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llama_srb.api.deps import State
from llama_srb.api.errors import install_error_handlers
from llama_srb.api.metrics import ConnectionsCollector, EngineCollector, WatchdogCollector
from llama_srb.api.middleware import install_middleware
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
from llama_srb.stories.owners import Handover
from llama_srb.stories.schema import Duplicate, StoryDraft, StoryPatch

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


def create_app(settings: Settings) -> FastAPI:
    state = AppState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.open_stories()
        loader = asyncio.create_task(state.load())
        try:
            yield
        finally:
            loader.cancel()
            await state.close()

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
        if state.loaded is None:
            status = "error" if state.load_error else "loading"
            return JSONResponse({"status": status, "error": state.load_error}, status_code=503)
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
        return JSONResponse({"status": "ok", "model": state.settings.model_name})

    registry = state.metrics.registry
    registry.register(EngineCollector(lambda: state.loaded.snapshot() if state.loaded else None))
    registry.register(WatchdogCollector(lambda: state.loaded.watchdog if state.loaded else None))
    registry.register(ConnectionsCollector(state.connections))

    @app.get("/metrics")
    async def metrics(state: State) -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1")
    routers = (models, completions, chat, live, tokenize, stories)
    for router in (module.router for module in routers):
        v1.include_router(router)
    app.include_router(v1)
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

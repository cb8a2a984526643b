"""What the HTTP layer holds: settings and, once loaded, the engine. Lives on app.state."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from llama_srb.api.errors import APIError
from llama_srb.api.metrics import ServerMetrics
from llama_srb.config import Settings
from llama_srb.engine.loader import LoadedEngine, load_engine

log = logging.getLogger(__name__)


@dataclass
class AppState:
    settings: Settings
    created: int = field(default_factory=lambda: int(time.time()))
    loaded: LoadedEngine | None = None
    load_error: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    draining: bool = False  # SIGTERM received: finishing what runs, taking nothing new

    def ready(self) -> LoadedEngine:
        """The loaded engine, or a 503 that says why there is none yet."""
        if self.loaded is None:
            detail = f": {self.load_error}" if self.load_error else ", try again shortly"
            raise APIError(503, f"the model is not loaded{detail}", code="model_loading")
        return self.loaded

    async def load(self) -> None:
        try:
            self.loaded = await asyncio.to_thread(load_engine, self.settings)
        except Exception as exc:  # reported by /health and every route, not a crash
            log.exception("model load failed")
            self.load_error = f"{type(exc).__name__}: {exc}"

    async def drain(self) -> None:
        """Stop taking requests; give running ones --shutdown-grace seconds to finish."""
        self.draining = True
        if self.loaded is not None:
            await self.loaded.runtime.drain(self.settings.shutdown_grace)

    async def close(self) -> None:
        if self.loaded is not None:
            await self.drain()  # a no-op when the server already drained on SIGTERM
            await asyncio.to_thread(self.loaded.close)

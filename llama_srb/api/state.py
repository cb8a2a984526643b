"""What the HTTP layer holds: settings and, once loaded, the engine. Lives on app.state."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from llama_srb.api.errors import APIError
from llama_srb.api.input.chat import ServedTemplate, serve_template
from llama_srb.api.metrics import ServerMetrics
from llama_srb.api.workers import Workers
from llama_srb.config import Settings
from llama_srb.loader import LoadedEngine, load_engine
from llama_srb.stories.store import StoryStore

log = logging.getLogger(__name__)

PREPARE_WORKERS = 4  # requests prepared at once; each job is bounded by the request limits
STORIES_FILE = "stories.sqlite3"  # in --data-dir


@dataclass
class AppState:
    settings: Settings
    created: int = field(default_factory=lambda: int(time.time()))
    loaded: LoadedEngine | None = None
    chat: ServedTemplate | None = None  # the chat template, chosen when the model loads
    load_error: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    draining: bool = False  # SIGTERM received: finishing what runs, taking nothing new
    engine_failure: str | None = None  # the engine thread died: the server must exit
    # Request preparation (tokenize, grammar, sampler chains) runs here, off the loop.
    workers: Workers = field(default_factory=lambda: Workers(PREPARE_WORKERS))
    stories: StoryStore | None = None  # the story library, opened at startup
    stories_error: str | None = None

    def chat_template(self) -> ServedTemplate:
        self.ready()
        assert self.chat is not None  # set before `loaded`
        return self.chat

    def ready(self) -> LoadedEngine:
        """The loaded engine, or a 503 that says why there is none."""
        if self.engine_failure is not None:
            raise APIError(503, self.engine_failure, code="engine_failed")
        if self.loaded is None:
            detail = f": {self.load_error}" if self.load_error else ", try again shortly"
            raise APIError(503, f"the model is not loaded{detail}", code="model_loading")
        return self.loaded

    def open_stories(self) -> None:
        """The library needs no model: it opens at once, and a data folder that cannot
        be written leaves the rest of the server serving (its routes say why they fail)."""
        path = self.settings.data_dir / STORIES_FILE
        try:
            self.stories = StoryStore(path)
        except Exception as exc:
            log.exception("the story library could not be opened")
            self.stories_error = f"the story library ({path}) could not be opened: {exc}"

    def story_store(self) -> StoryStore:
        if self.stories is None:
            raise APIError(503, self.stories_error or "the story library is not open")
        return self.stories

    async def load(self) -> None:
        loop = asyncio.get_running_loop()

        def on_death(reason: str) -> None:  # on the dying engine thread
            loop.call_soon_threadsafe(self._engine_died, reason)

        def load() -> LoadedEngine:
            loaded = load_engine(self.settings, on_death)
            try:
                self.chat = serve_template(self.settings.chat_template, loaded.model)
            except BaseException:
                loaded.close()
                raise
            return loaded

        try:
            self.loaded = await asyncio.to_thread(load)
        except Exception as exc:  # reported by /health and every route, not a crash
            log.exception("model load failed")
            self.load_error = f"{type(exc).__name__}: {exc}"

    def _engine_died(self, reason: str) -> None:
        """Everyone waiting hears it now, /health turns 503, and the server exits
        non-zero (api/shutdown.py) so that a supervisor starts a fresh one."""
        self.engine_failure = reason
        if self.loaded is not None:
            self.loaded.runtime.fail_flights(reason)

    async def drain(self) -> None:
        """Stop taking requests; give running ones --shutdown-grace seconds to finish."""
        self.draining = True
        if self.loaded is not None:
            await self.loaded.runtime.drain(self.settings.shutdown_grace)

    async def close(self) -> None:
        if self.loaded is not None:
            await self.drain()  # a no-op when the server already drained on SIGTERM
            await asyncio.to_thread(self.loaded.close)
        if self.stories is not None:
            self.stories.close()
        self.workers.close()

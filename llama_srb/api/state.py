"""What the HTTP layer holds: settings and, once loaded, the engine's face (served.py).
Lives on app.state; a route reaches it through deps.py's `app_state`."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from fastapi import Request

from llama_srb.api.auth import ApiKeys
from llama_srb.api.clients import Caller, caller_of, library_access
from llama_srb.api.connections import ConnectionLimits, OpenConnections, networks
from llama_srb.api.errors import APIError
from llama_srb.api.input.chat import ServedTemplate, serve_template
from llama_srb.api.live import LiveCalls
from llama_srb.api.metrics import ServerMetrics
from llama_srb.api.workers import Workers
from llama_srb.config import Settings
from llama_srb.engine.watch import Step
from llama_srb.loader import load_engine
from llama_srb.served import Served
from llama_srb.stories.owners import Access, CreationRate
from llama_srb.stories.store import StoryStore

log = logging.getLogger(__name__)

PREPARE_WORKERS = 4  # requests prepared at once; each job is bounded by the request limits
WATCH_PERIOD_S = 1.0  # how often the watchdog looks, so a stuck step is logged on time
STORIES_FILE = "stories.sqlite3"  # in --data-dir


@dataclass
class AppState:
    settings: Settings
    created: int = field(default_factory=lambda: int(time.time()))
    loaded: Served | None = None
    chat: ServedTemplate | None = None  # the chat template, chosen when the model loads
    load_error: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    live: LiveCalls = field(default_factory=LiveCalls)  # calls a writer may act on
    # Request preparation (tokenize, grammar, sampler chains) runs here, off the loop.
    workers: Workers = field(default_factory=lambda: Workers(PREPARE_WORKERS))
    keys: ApiKeys = field(init=False)
    connections: OpenConnections = field(init=False)  # the HTTP server's (api/connections.py)
    # The engine thread was still in a step when the server closed: it must exit now.
    stuck_at_exit: bool = False

    def __post_init__(self) -> None:
        settings = self.settings
        self.keys = ApiKeys(settings)
        limits = ConnectionLimits(
            header_timeout=settings.header_timeout,
            max_connections=settings.max_connections,
            max_per_address=settings.max_connections_per_client,
            exempt=networks(settings.trusted_proxies or []),
        )
        self.connections = OpenConnections(limits)
        self.story_rate = CreationRate(settings.story_creations)

    def caller(self, http: Request) -> Caller:
        return caller_of(http, self.keys)

    def library_access(self, http: Request) -> Access:
        return library_access(http, self.keys)

    def stuck(self) -> Step | None:
        """The engine's step in progress, if it has run past --stuck-after."""
        return self.loaded.watchdog.stuck() if self.loaded is not None else None

    # The shutdown's state is the engine thread's doorway's (engine/runtime.py), read here.
    @property
    def draining(self) -> bool:
        """SIGTERM received: finishing what runs, taking nothing new."""
        return self.loaded is not None and self.loaded.runtime.closing

    @property
    def engine_failure(self) -> str | None:
        """Why the engine thread died, once it has: the server must exit."""
        return self.loaded.runtime.died if self.loaded is not None else None

    stories: StoryStore | None = None  # the story library, opened at startup
    stories_error: str | None = None
    story_rate: CreationRate = field(init=False)  # new stories per writer (--story-creations)

    def chat_template(self) -> ServedTemplate:
        self.ready()
        assert self.chat is not None  # set before `loaded`
        return self.chat

    def ready(self) -> Served:
        """The loaded engine's face, or a 503 that says why there is none."""
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

        def load() -> Served:
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
            return
        while True:  # until the lifespan ends (it cancels this task): logged on time
            await asyncio.sleep(WATCH_PERIOD_S)
            self.stuck()

    def _engine_died(self, reason: str) -> None:
        """Everyone waiting hears it now; /health turns 503 and the server exits non-zero
        (api/shutdown.py) from the runtime's `died`, so that a supervisor starts a fresh one."""
        if self.loaded is not None:
            self.loaded.runtime.fail_flights(reason)

    def hurry(self) -> None:
        """End the grace period now (a second signal)."""
        if self.loaded is not None:
            self.loaded.runtime.hurry()

    async def drain(self) -> None:
        """Stop taking requests; give running ones --shutdown-grace seconds to finish."""
        if self.loaded is not None:
            await self.loaded.runtime.drain(self.settings.shutdown_grace)

    async def close(self) -> None:
        if self.loaded is not None:
            if not self.draining:  # drained already on SIGTERM: not a second grace period
                await self.drain()
            self.stuck_at_exit = not await asyncio.to_thread(self.loaded.close)
        if self.stories is not None:
            self.stories.close()
        self.workers.close()

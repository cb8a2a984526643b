"""What the HTTP layer holds: settings, the models (api/models.py: each loaded engine's
face, served.py), the library, the workers. Lives on app.state; a route reaches it through
deps.py's `app_state`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from functools import partial

from fastapi import Request

from llama_srb.api.auth import ApiKeys
from llama_srb.api.clients import Caller, caller_of, library_access
from llama_srb.api.connections import ConnectionLimits, OpenConnections, networks
from llama_srb.api.errors import APIError
from llama_srb.api.input.chat import ServedTemplate, serve_template
from llama_srb.api.live import LiveCalls
from llama_srb.api.metrics import ServerMetrics
from llama_srb.api.models import Loader, Models, ModelSlot, check_model
from llama_srb.api.workers import Workers
from llama_srb.config import Settings
from llama_srb.engine.watch import Step
from llama_srb.loader import available_memory, load_engine
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
    models: Models = field(init=False)  # every model served, loaded on demand (api/models.py)
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    live: LiveCalls = field(default_factory=LiveCalls)  # calls a writer may act on
    # Request preparation (tokenize, grammar, sampler chains) runs here, off the loop.
    workers: Workers = field(default_factory=lambda: Workers(PREPARE_WORKERS))
    keys: ApiKeys = field(init=False)
    connections: OpenConnections = field(init=False)  # the HTTP server's (api/connections.py)
    stories: StoryStore | None = None  # the story library, opened at startup
    stories_error: str | None = None
    story_rate: CreationRate = field(init=False)  # new stories per writer (--story-creations)
    # The server's shutdown (api/shutdown.py): SIGTERM received, and whether an engine
    # thread was still in a step when it closed (the process must exit now). Each engine's
    # own doorway refuses requests while it drains, for a shutdown or an unload.
    draining: bool = False
    stuck_at_exit: bool = False
    _died: str | None = None  # why an engine thread died (kept past its model's unload)
    _loop: asyncio.AbstractEventLoop | None = None
    # How a model is loaded (api/models.py Loader); the unit tests give one over a fake
    # engine. Default: the real one, whose engine threads report their death here.
    loader: Loader | None = None

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
        if self.loader is None:  # the real one: a file, checked before others are unloaded
            load = partial(_load_model, on_death=self._on_death)
            self.models = Models(settings, load, _check_model)
        else:
            self.models = Models(settings, self.loader)

    def caller(self, http: Request) -> Caller:
        return caller_of(http, self.keys)

    def library_access(self, http: Request) -> Access:
        return library_access(http, self.keys)

    def stuck(self) -> Step | None:
        """A loaded engine's step in progress, if it has run past --stuck-after."""
        for slot in self.models.loaded():
            step = slot.ready().watchdog.stuck()
            if step is not None:
                return step
        return None

    @property
    def engine_failure(self) -> str | None:
        """Why an engine thread died, once one has: the server must exit."""
        died = (slot.ready().runtime.died for slot in self.models.loaded())
        return self._died or next((why for why in died if why), None)

    def use(self, model: str | None = None) -> AbstractAsyncContextManager[ModelSlot]:
        """The model a request names (None: the current one), loaded and held until the
        block ends (api/models.py): 503 while the server drains or an engine died."""
        if self.engine_failure is not None:
            raise APIError(503, self.engine_failure, code="engine_failed")
        if self.draining:
            raise APIError(503, "the server is shutting down", code="server_shutting_down")
        return self.models.use(model)

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

    def _on_death(self, reason: str) -> None:  # on the dying engine thread
        assert self._loop is not None  # set by `run` before the first load
        self._loop.call_soon_threadsafe(self._engine_died, reason)

    async def run(self) -> None:
        """Load the default model, then watch the engines (and, with
        --sleep-idle-seconds, unload idle models) until the lifespan ends."""
        self._loop = asyncio.get_running_loop()
        idle = self.settings.sleep_idle_seconds
        sleeper = asyncio.create_task(self.models.sleep_idle(idle)) if idle else None
        try:
            with contextlib.suppress(APIError):  # /health and every route say why
                await self.models.load(self.models.default)
            while True:  # until the lifespan ends (it cancels this task): logged on time
                await asyncio.sleep(WATCH_PERIOD_S)
                self.stuck()
        finally:
            if sleeper is not None:
                sleeper.cancel()

    def _engine_died(self, reason: str) -> None:
        """Everyone waiting hears it now; /health turns 503 and the server exits non-zero
        (api/shutdown.py) from `engine_failure`, so that a supervisor starts a fresh one."""
        self._died = self._died or reason
        for slot in self.models.loaded():
            if slot.ready().runtime.died:
                slot.ready().runtime.fail_flights(reason)

    def hurry(self) -> None:
        """End the grace period now (a second signal)."""
        for slot in self.models.loaded():
            slot.ready().runtime.hurry()

    async def drain(self) -> None:
        """Stop taking requests; give running ones --shutdown-grace seconds to finish."""
        self.draining = True
        grace = self.settings.shutdown_grace
        await asyncio.gather(*(s.ready().runtime.drain(grace) for s in self.models.loaded()))

    async def close(self) -> None:
        if not self.draining:  # drained already on SIGTERM: not a second grace period
            await self.drain()
        self.stuck_at_exit = not await self.models.close(self.settings.shutdown_grace)
        if self.stories is not None:
            self.stories.close()
        self.workers.close()


def _check_model(settings: Settings, unloading: list[Settings]) -> None:
    check_model(settings, unloading, available_memory())


def _load_model(
    settings: Settings, on_death: Callable[[str], None]
) -> tuple[Served, ServedTemplate]:
    """A model's engine and chat template (on a worker thread)."""
    loaded = load_engine(settings, on_death)
    try:
        return loaded, serve_template(settings.chat_template, loaded.model)
    except BaseException:
        loaded.close()
        raise

"""Every model this server serves, loaded on demand (--model, --models, --models-dir,
--models-max, --sleep-idle-seconds, --unload-grace).

One `ModelSlot` per model: its settings, and once loaded its engine's face (served.py)
and chat template. `Models` alone loads and unloads them, on the event loop, one switch
at a time: a request for a model that is not loaded waits for its load (every request for
it waits for the same load, in the order they came); loading one model more than
--models-max allows first unloads the least recently used, once the requests on it end or
--unload-grace passes. A route holds its slot (`Models.use`) from its checks until its
requests are in the engine's hands, where the runtime counts them: an unload waits for
both, so no route ever reads a closed model. An unload saves the model's cached paths to
its disk tier (loader.py `_Loaded.close`), so its stories continue from there when it
comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from llama_srb.api.errors import APIError
from llama_srb.api.input.chat import ServedTemplate
from llama_srb.config import GiB, Settings
from llama_srb.engine.generation import Unloaded
from llama_srb.served import Served

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often an unload looks whether the requests on its model have ended

# Loads a model's engine and picks its chat template (on a worker thread: seconds).
Loader = Callable[[Settings], tuple[Served, ServedTemplate]]
# Refuses (APIError) a model that cannot load, before any other is unloaded for it: given
# its settings and those of the models its load would unload (check_model below).
Check = Callable[[Settings, list[Settings]], None]


class ModelState(StrEnum):
    loaded = "loaded"
    loading = "loading"
    unloading = "unloading"
    sleeping = "sleeping"  # was loaded, unloaded since: its stories wait on disk
    available = "available"  # not loaded since the server started
    failed = "failed"  # its last load failed (the next request tries again)


@dataclass(eq=False)
class ModelSlot:
    """One model: what serves it, while it is loaded, and who is using it."""

    name: str
    settings: Settings  # the server's, with this model's file
    served: Served | None = None
    chat: ServedTemplate | None = None
    users: int = 0  # routes between their checks and handing their requests to the engine
    last_used: float = field(default_factory=time.monotonic)
    loads: int = 0
    error: str | None = None  # why its last load failed
    loading: asyncio.Task[None] | None = None
    unloading: asyncio.Task[None] | None = None

    @property
    def state(self) -> ModelState:
        if self.unloading is not None:
            return ModelState.unloading
        if self.loading is not None:
            return ModelState.loading
        if self.served is not None:
            return ModelState.loaded
        if self.error is not None:
            return ModelState.failed
        return ModelState.sleeping if self.loads else ModelState.available

    @property
    def busy(self) -> bool:
        """Requests are on it: being prepared, waiting or running."""
        return self.users > 0 or (self.served is not None and self.served.runtime.in_flight > 0)

    def ready(self) -> Served:
        """Its engine's face: only inside `Models.use`, where it is loaded."""
        assert self.served is not None, "a slot is used only while loaded"
        return self.served

    def chat_template(self) -> ServedTemplate:
        assert self.chat is not None, "a slot is used only while loaded"
        return self.chat


def model_name(settings: Settings, spec: str) -> str:
    """The public name of a model given as `spec` (a bundled name or a GGUF file)."""
    return settings.model_copy(update={"model": spec, "alias": None}).model_name


class Models:
    """The slots, and the one place that loads and unloads them (event-loop thread)."""

    def __init__(self, settings: Settings, load: Loader, check: Check | None = None) -> None:
        self.settings = settings
        self._load = load
        self._check = check
        self._slots: dict[str, ModelSlot] = {}
        self._switch = asyncio.Lock()  # one load or unload at a time
        self.default = self._add(settings.model_name, settings)
        for spec in settings.models or []:
            self._add_spec(spec)
        self.scan()

    def _add(self, name: str, settings: Settings) -> ModelSlot:
        if name in self._slots:
            log.warning("two models are named %s: the first one is served", name)
            return self._slots[name]
        slot = self._slots[name] = ModelSlot(name, settings)
        return slot

    def _add_spec(self, spec: str) -> None:
        # Another model's template is its own: --chat-template is the default model's.
        own = {"model": spec, "alias": None, "chat_template": None, "models": None}
        self._add(model_name(self.settings, spec), self.settings.model_copy(update=own))

    def scan(self) -> None:
        """Add the GGUF files of --models-dir that are new since the last look."""
        folder = self.settings.models_dir
        if folder is None:
            return
        try:
            files = sorted(p for p in folder.glob("*.gguf") if p.is_file())
        except OSError as exc:
            log.warning("--models-dir %s cannot be read: %s", folder, exc)
            return
        for path in files:
            if path.stem not in self._slots:
                self._add_spec(str(path))

    @property
    def slots(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def loaded(self) -> list[ModelSlot]:
        return [s for s in self._slots.values() if s.served is not None]

    def current(self) -> ModelSlot:
        """The model a request that names none gets: the one used last, else the default."""
        live = self.loaded()
        return max(live, key=lambda s: s.last_used) if live else self.default

    def slot(self, name: str | None, param: str = "model") -> ModelSlot:
        """The slot a request names (None: the current one), or a 404 that lists them."""
        if not name:
            return self.current()
        if name not in self._slots:
            self.scan()  # a file dropped into --models-dir since
        slot = self._slots.get(name)
        if slot is None:
            names = ", ".join(f"`{n}`" for n in self._slots)
            raise APIError(
                404,
                f"model `{name}` is not served here; this server serves {names}",
                param=param,
                code="model_not_found",
            )
        return slot

    def named(self, name: str | None) -> str | None:
        """`name` if it is one of ours, else None (the current model): for the routes of
        other servers whose `model` field is not checked (vLLM's /tokenize)."""
        return name if name in self._slots else None

    @contextlib.asynccontextmanager
    async def use(self, name: str | None) -> AsyncIterator[ModelSlot]:
        """The model `name` names (None: the current one), loaded and held: no unload
        begins while a route holds it. Hold it until the requests are submitted."""
        slot = self.slot(name)
        while slot.served is None or slot.unloading is not None:
            await self.load(slot)
        slot.users += 1
        slot.last_used = time.monotonic()
        try:
            yield slot
        finally:
            slot.users -= 1
            slot.last_used = time.monotonic()

    async def load(self, slot: ModelSlot) -> None:
        """Load `slot` unless it is (after an unload of it in progress). Loads of one
        model at once make one; a waiter that leaves does not cancel it."""
        if slot.unloading is not None:
            await asyncio.shield(slot.unloading)
        if slot.served is not None:
            return
        if slot.loading is None:
            slot.loading = asyncio.create_task(self._load_now(slot), name=f"load {slot.name}")
            slot.loading.add_done_callback(_retrieved)
        await asyncio.shield(slot.loading)

    async def _load_now(self, slot: ModelSlot) -> None:
        try:
            async with self._switch:
                # the least recently used first, those with no requests on them before
                others = sorted(
                    (s for s in self.loaded() if s is not slot),
                    key=lambda s: (s.busy, s.last_used),
                )
                victims = others[: max(0, len(others) + 1 - self.settings.models_max)]
                if self._check is not None:
                    victims_settings = [v.settings for v in victims]
                    await asyncio.to_thread(self._check, slot.settings, victims_settings)
                for victim in victims:
                    await self._unload(victim, f"to load `{slot.name}`", self.settings.unload_grace)
                log.info("loading model %s", slot.name)
                slot.served, slot.chat = await asyncio.to_thread(self._load, slot.settings)
                slot.loads += 1
                slot.error = None
                slot.last_used = time.monotonic()
        except APIError as exc:
            slot.error = exc.message
            raise
        except Exception as exc:
            log.exception("loading model %s failed", slot.name)
            slot.error = f"{type(exc).__name__}: {exc}"
            raise APIError(
                503,
                f"model `{slot.name}` could not be loaded: {slot.error}",
                code="model_load_failed",
            ) from exc
        finally:
            slot.loading = None

    async def unload(self, slot: ModelSlot, why: str, grace: float) -> bool:
        """Unload `slot` if it is loaded (False if not); its requests get `grace` s."""
        async with self._switch:
            if slot.served is None:
                return False
            await self._unload(slot, why, grace)
            return True

    async def _unload(self, slot: ModelSlot, why: str, grace: float) -> None:
        task = asyncio.create_task(self._unload_now(slot, why, grace))
        slot.unloading = task
        try:
            await asyncio.shield(task)
        finally:
            slot.unloading = None

    async def _unload_now(self, slot: ModelSlot, why: str, grace: float) -> None:
        served = slot.ready()
        log.info("unloading model %s (%s)", slot.name, why)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        # Routes still preparing requests read the model: always waited for (their work
        # is bounded); the requests running on it get what is left of the grace.
        while slot.users:
            await asyncio.sleep(POLL_S)

        def ending(_: float) -> Unloaded:
            return Unloaded(
                f"model `{slot.name}` was unloaded {why}; its requests had {grace:g} s"
                " (--unload-grace) to end"
            )

        await served.runtime.drain(max(0.0, deadline - loop.time()), ending)
        slot.served = slot.chat = None
        if not await asyncio.to_thread(served.close):
            log.critical("model %s's engine is stuck in a step: its memory stays", slot.name)

    async def sleep_idle(self, idle_s: float) -> None:
        """Unload every model idle for `idle_s` seconds, until cancelled."""
        while True:
            await asyncio.sleep(min(1.0, idle_s / 4))
            for slot in self.loaded():
                if self._idle(slot, idle_s):
                    async with self._switch:  # idle still, now that it is this one's turn?
                        if self._idle(slot, idle_s):
                            await self._unload(slot, f"after {idle_s:g} s idle", 0.0)

    @staticmethod
    def _idle(slot: ModelSlot, idle_s: float) -> bool:
        now = time.monotonic()
        if slot.busy:  # a request runs on it: idle from when it ends
            slot.last_used = now
        return slot.served is not None and now - slot.last_used >= idle_s

    async def close(self, grace: float) -> bool:
        """Drain and close every loaded model (shutdown); False if an engine was stuck.
        A load in progress ends first: its engine is closed with the others."""
        for slot in self.slots:
            if slot.loading is not None:
                await asyncio.wait([slot.loading])
        clean = True
        for slot in self.loaded():
            served = slot.ready()
            if not served.runtime.closing:  # drained already on SIGTERM: no second grace
                await served.runtime.drain(grace)
            clean &= await asyncio.to_thread(served.close)
            slot.served = None
        return clean


def _retrieved(task: asyncio.Task[None]) -> None:
    """A load's failure reaches its waiters; one that all of them left is only logged."""
    if not task.cancelled():
        task.exception()


GGUF_MAGIC = b"GGUF"


def check_model(settings: Settings, unloading: list[Settings], available: int | None) -> None:
    """Refuse a load that cannot succeed before anything is unloaded for it: the file must
    be there and be a GGUF file, and its weights must fit in the host memory `available`
    now plus what the models it would unload hold (their files' sizes). The context's
    cells are then fitted to what is left by the loader, or refused there with their
    numbers when --n-ctx fixes them."""
    name, path = settings.model_name, settings.resolved_model_path()
    try:
        with path.open("rb") as file:
            magic = file.read(len(GGUF_MAGIC))
        size = path.stat().st_size
    except OSError as exc:
        raise APIError(
            503, f"model `{name}`: {path} cannot be read ({exc.strerror})", code="model_load_failed"
        ) from None
    if magic != GGUF_MAGIC:
        raise APIError(503, f"model `{name}`: {path} is not a GGUF file", code="model_load_failed")
    if available is None:
        return
    freed = sum(_size(other.resolved_model_path()) for other in unloading)
    if size > available + freed:
        raise APIError(
            503,
            f"model `{name}` needs {size / GiB:.1f} GiB for its weights and only"
            f" {(available + freed) / GiB:.1f} GiB of memory would be available: lower"
            " --models-max, or unload a model",
            code="model_too_large",
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

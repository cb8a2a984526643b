"""The engine thread's guard, without a model: a failing submission fails its request, and
a dead engine thread fails every waiting reader at once and makes the server exit. The
shutdown's state (draining, the engine's death) is the runtime's, which the server reads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llama_srb.api.input.chat import ServedTemplate
from llama_srb.api.state import AppState
from llama_srb.config import Settings
from llama_srb.engine.build import Submission
from llama_srb.engine.generation import EngineDied
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.request import Request
from llama_srb.engine.runtime import Runtime
from llama_srb.engine.stats import EngineSnapshot
from llama_srb.engine.watch import StepWatch, Watchdog
from llama_srb.served import Served
from tests.unit.fake_context import FakeModel, bare_request


class Fatal(BaseException):
    """Not an Exception: escapes the per-step guard, as a broken invariant would."""


class FakeEngine:
    """Just enough engine for the runtime: `add` and `step` misbehave on demand."""

    has_work = False

    def __init__(self, add_error: Exception | None = None, step_error: Any = None) -> None:
        self.add_error, self.step_error = add_error, step_error
        self.failed: list[str] = []
        self.requests: list[Request] = []

    def warm_up(self) -> None:
        pass

    def add(self, request: Request) -> list[RequestOutput]:
        self.requests.append(request)
        if self.add_error is not None:
            raise self.add_error
        return []

    def step(self, deliver: Callable[[list[RequestOutput]], None]) -> list[RequestOutput]:
        if self.step_error is not None and self.requests:
            raise self.step_error
        return []

    def fail(self, requests: list[Request], message: str) -> list[RequestOutput]:
        self.failed.append(message)
        return [
            RequestOutput(r.request_id, [], 1, 1, 0, r.times, finished=True, error=message)
            for r in requests
        ]

    def fail_all(self, message: str) -> list[RequestOutput]:
        self.failed.append(message)
        return []

    def abort(self, request_id: str) -> list[RequestOutput]:
        return []


def make_request() -> Request:
    return bare_request("cmpl-1", [1, 2])


def test_a_submission_that_raises_fails_its_request_and_the_engine_keeps_serving() -> None:
    async def scenario() -> RequestOutput:
        runtime = Runtime(FakeEngine(add_error=ValueError("bad state")))  # type: ignore[arg-type]
        runtime.start()
        try:
            generation = runtime.generate(Submission(make_request()), timeout=10)
            return await anext(generation)
        finally:
            runtime.stop()

    output = asyncio.run(scenario())
    assert output.finished and output.error == "engine error: bad state"


def test_a_dead_engine_thread_fails_every_reader_at_once() -> None:
    async def scenario() -> tuple[str | None, BaseException]:
        loop = asyncio.get_running_loop()
        deaths: asyncio.Queue[str] = asyncio.Queue()
        engine = FakeEngine(step_error=Fatal("invariant broken"))
        runtime = Runtime(
            engine,  # type: ignore[arg-type]
            on_death=lambda why: loop.call_soon_threadsafe(deaths.put_nowait, why),
        )
        runtime.start()
        generation = runtime.generate(Submission(make_request()), timeout=600)
        reason = await asyncio.wait_for(deaths.get(), 10)
        runtime.fail_flights(reason)
        with pytest.raises(EngineDied) as raised:
            await asyncio.wait_for(anext(generation), 10)  # not after the 600 s timeout
        runtime.stop()
        return runtime.died, raised.value

    died, error = asyncio.run(scenario())
    assert died is not None and "Fatal: invariant broken" in died
    assert str(error) == died


def test_after_the_engine_died_the_server_refuses_work_and_exits() -> None:
    """The runtime keeps the death (`died`), the server reads it: one owner."""
    from llama_srb.api.errors import APIError
    from llama_srb.api.shutdown import GracefulServer

    async def scenario() -> tuple[APIError, bool, bool]:
        loop = asyncio.get_running_loop()
        deaths: asyncio.Queue[str] = asyncio.Queue()
        runtime = Runtime(
            FakeEngine(step_error=Fatal("x")),  # type: ignore[arg-type]
            on_death=lambda why: loop.call_soon_threadsafe(deaths.put_nowait, why),
        )
        runtime.start()
        state = AppState(Settings(), loader=lambda _: (face(runtime), ServedTemplate("", "none")))
        await state.models.load(state.models.default)
        before = state.engine_failure is None
        runtime.generate(Submission(make_request()), timeout=600)
        assert await asyncio.wait_for(deaths.get(), 10) == state.engine_failure
        with pytest.raises(APIError) as refused:
            state.use()
        server = GracefulServer.__new__(GracefulServer)  # no socket: only on_tick is asked
        server.state = state
        exits = await server.on_tick(0)
        runtime.stop()
        state.workers.close()
        return refused.value, exits, before

    refused, exits, alive_before = asyncio.run(scenario())
    assert alive_before
    assert refused.status == 503 and refused.code == "engine_failed"
    assert "Fatal: x" in refused.message
    assert exits


def test_draining_is_the_runtime_s_state_read_by_health_and_routes(
    app_with_state: tuple[TestClient, AppState],
) -> None:
    client, state = app_with_state
    assert client.get("/health").json()["status"] == "ok" and not state.draining
    asyncio.run(state.drain())  # SIGTERM: the runtime closes, and the server says so
    assert state.draining and state.models.default.ready().runtime.closing
    health = client.get("/health")
    assert (health.status_code, health.json()["status"]) == (503, "draining")
    refused = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "top_k": 8})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "server_shutting_down"


def face(runtime: Runtime) -> Served:
    """The face the API sees of a runtime over a FakeEngine (no snapshot, never stuck)."""
    return Served(
        model=FakeModel(),  # type: ignore[arg-type]
        n_ctx=1024,
        runtime=runtime,
        snapshot=EngineSnapshot,
        watchdog=Watchdog(StepWatch(), 0),
        close=lambda: runtime.stop(10),
    )


class SlowWarmUp(FakeEngine):
    """Its first decode ends only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.warm = False

    def warm_up(self) -> None:
        self.release.wait(10)
        self.warm = True


def test_start_returns_once_the_first_decode_is_done() -> None:
    """The loader marks the model loaded (and /health ok) when `start` returns: a request
    sent then must not wait for the warm-up decode (~0.5 s on this CPU)."""
    engine = SlowWarmUp()
    threading.Timer(0.2, engine.release.set).start()
    runtime = Runtime(engine)  # type: ignore[arg-type]
    runtime.start()
    assert engine.warm
    runtime.stop()


class DiesWarmingUp(FakeEngine):
    def warm_up(self) -> None:
        raise Fatal("no device")


def test_start_returns_when_the_warm_up_kills_the_engine_thread() -> None:
    runtime = Runtime(DiesWarmingUp())  # type: ignore[arg-type]
    runtime.start()
    assert runtime.died is not None and "no device" in runtime.died

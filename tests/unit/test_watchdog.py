"""The engine thread's watchdog over a fake context whose decode blocks, as a native call
that never returns would: /health and /metrics report it, the log names the request, the
runtime can tell it cannot stop the thread, and all of it recovers when the step returns."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from llama_srb.api.app import create_app
from llama_srb.api.input.chat import ServedTemplate
from llama_srb.config import Settings
from llama_srb.engine.build import Submission
from llama_srb.engine.generation import Generation
from llama_srb.engine.runtime import Runtime
from llama_srb.engine.watch import Step, StepWatch, Watchdog
from llama_srb.native import Batch
from tests.unit.fake_context import (
    FakeContext,
    FakeModel,
    load_default,
    make_engine,
    make_request,
    served,
)


class BlockingContext(FakeContext):
    """Its decodes wait while `held` is set (the engine thread stays inside the call)."""

    def __init__(self, base: FakeContext) -> None:
        super().__init__(base.n_ctx, base.n_batch, base.n_seq_max, base.table)
        self.held = threading.Event()
        self.released = threading.Event()
        self.entered = threading.Event()

    def decode(self, batch: Batch) -> None:
        if self.held.is_set():
            self.entered.set()
            self.released.wait()
        super().decode(batch)


def wait_for(condition: Callable[[], object]) -> None:
    """Poll until `condition()` holds (it always does soon: a thread is about to get there)."""
    while not condition():
        time.sleep(0.005)


@pytest.fixture
def blocked() -> Iterator[tuple[Runtime, BlockingContext]]:
    """A runtime whose engine thread is blocked in the decode of request `stuck-1`."""
    engine, base = make_engine()
    ctx = BlockingContext(base)
    engine.ctx = ctx
    ctx.held.set()
    runtime = Runtime(engine)
    runtime.start()
    loop = asyncio.new_event_loop()
    request = make_request("stuck-1", FakeModel.tokens("story"), n=2, max_tokens=4)

    async def submit() -> Generation:
        return runtime.generate(Submission(request))

    generation = loop.run_until_complete(submit())  # held: dropping it would abort it
    ctx.entered.wait()
    try:
        yield runtime, ctx
    finally:
        ctx.released.set()
        runtime.stop()
        del generation
        loop.close()


def test_a_step_past_its_bound_is_reported_once_with_its_requests(
    blocked: tuple[Runtime, BlockingContext], caplog: pytest.LogCaptureFixture
) -> None:
    runtime, ctx = blocked
    watch = runtime.engine.watch
    watchdog = Watchdog(watch, bound=0.01)
    wait_for(lambda: watchdog.age() > 0.01)
    with caplog.at_level(logging.WARNING):
        step = watchdog.stuck()
        assert step is not None and step.request_ids == ("stuck-1",)
        assert watchdog.stuck() is step and watchdog.episodes == 1  # counted once
        assert "stuck-1" in caplog.text and "--stuck-after" in caplog.text

        ctx.held.clear()
        ctx.released.set()  # the native call returns at last
        wait_for(lambda: watch.current is not step)
        assert watchdog.stuck() is None
        assert "returned after" in caplog.text
    assert watchdog.episodes == 1 and watch.longest > 0.01


def test_within_its_bound_a_long_step_is_not_stuck(
    blocked: tuple[Runtime, BlockingContext],
) -> None:
    runtime, _ = blocked
    watchdog = Watchdog(runtime.engine.watch, bound=3600)
    assert watchdog.age() > 0 and watchdog.stuck() is None
    assert Watchdog(runtime.engine.watch, bound=0).stuck() is None  # 0: never


def test_the_runtime_says_when_it_cannot_stop_its_thread(
    blocked: tuple[Runtime, BlockingContext],
) -> None:
    runtime, ctx = blocked
    assert runtime.stop(timeout=0.05) is False
    ctx.held.clear()
    ctx.released.set()
    assert runtime.stop(timeout=30) is True


def test_a_watch_records_each_step_and_the_longest() -> None:
    watch = StepWatch()
    watch.begin(["a", "b"])
    step = watch.current
    assert isinstance(step, Step) and step.request_ids == ("a", "b") and step.ended is None
    watch.end()
    assert watch.current is None and step.ended is not None
    assert watch.longest == step.ended - step.started


def test_health_and_metrics_report_a_stuck_engine_then_recover(
    blocked: tuple[Runtime, BlockingContext],
) -> None:
    """The app in-process (no lifespan: no model is loaded), its engine the blocked one."""
    runtime, ctx = blocked
    face = served(runtime.engine, runtime, stuck_after=0.01)
    app = create_app(Settings(stuck_after=0.01), loader=lambda _: (face, ServedTemplate("", "")))
    state = app.state.srb
    load_default(state)
    wait_for(lambda: face.watchdog.age() > 0.01)
    client = TestClient(app)

    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == "stuck" and health.json()["requests"] == ["stuck-1"]
    metrics = client.get("/metrics").text
    assert "llama_srb_engine_stuck 1.0" in metrics
    assert "llama_srb_engine_stuck_steps_total 1.0" in metrics
    age = next(
        line for line in metrics.splitlines() if line.startswith("llama_srb_engine_step_age")
    )
    assert float(age.split()[1]) > 0.01
    refused = client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 1})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_stuck"

    ctx.held.clear()
    ctx.released.set()
    wait_for(lambda: runtime.engine.watch.current is None)
    assert client.get("/health").json()["status"] == "ok"
    assert "llama_srb_engine_stuck 0.0" in client.get("/metrics").text

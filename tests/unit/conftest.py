"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llama_srb.api.app import create_app
from llama_srb.config import Settings
from llama_srb.engine.runtime import Runtime
from tests.unit.fake_context import FakeModel, make_engine


@pytest.fixture
def client() -> Iterator[TestClient]:
    """The app in process (FastAPI's TestClient) over the engine and a fake context."""
    engine, ctx = make_engine()
    runtime = Runtime(engine)
    runtime.start()
    app = create_app(Settings(max_n=8))
    loaded: Any = SimpleNamespace(
        model=FakeModel(), engine=engine, runtime=runtime, n_ctx=ctx.n_ctx
    )
    app.state.srb.loaded = loaded
    try:
        yield TestClient(app)  # not entered: no lifespan, which would load the real model
    finally:
        runtime.stop()

"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from llama_srb.api.app import create_app
from llama_srb.api.deps import app_state
from llama_srb.api.input.chat import ChatTemplate, ServedTemplate
from llama_srb.api.state import AppState
from llama_srb.config import Settings
from llama_srb.engine.runtime import Runtime
from tests.unit.fake_context import loaded_state, make_engine, served

# A chat template the fake model reads: each turn's text and a space (the BOS is added by
# input/chat.py, where the template does not write it).
FAKE_CHAT = "{% for m in messages %}{{ m.content }} {% endfor %}"


@pytest.fixture
def app_with_state() -> Iterator[tuple[TestClient, AppState]]:
    """The app in process (FastAPI's TestClient, not entered: no lifespan, which would load
    the real model) and the server state its routes get (deps.py `app_state`, swapped with
    `dependency_overrides`): the engine over a fake context, behind the face the loader
    builds (served.py), and a chat template for the fake model."""
    engine, _ = make_engine()
    runtime = Runtime(engine)
    runtime.start()
    settings = Settings(max_n=8)
    app = create_app(settings)
    chat = ServedTemplate(FAKE_CHAT, "the unit tests'", (), ChatTemplate(FAKE_CHAT))
    state = loaded_state(settings, served(engine, runtime), chat)
    app.dependency_overrides[app_state] = lambda: state
    try:
        yield TestClient(app), state
    finally:
        runtime.stop()
        state.workers.close()
        app.state.srb.workers.close()


@pytest.fixture
def client(app_with_state: tuple[TestClient, AppState]) -> TestClient:
    return app_with_state[0]

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.bundled import FACTS, MODELS, ModelFacts

# The browser for the UI tests (test_ui_*.py), launched once per session.
from tests.integration.ui_helpers import browser, open_ui  # noqa: F401
from tests.support.server import RunningServer, run_server

# Gemma 3's template as a file: the unit tests compare the bundled copy with it.
CHAT_TEMPLATE = Path(__file__).parents[1] / "data" / "gemma3_chat_template.jinja"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "models(*names): run only on these bundled models (the test's docstring says why)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that needs a model, through any fixture, runs once per bundled model,
    its id naming the model. The parameter is session-scoped, so pytest runs all of one
    model's tests before the other's: each model's servers start once, and one model's
    are stopped before the other's start."""
    if "bundled_model" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("models")
    names = list(marker.args) if marker else MODELS
    assert set(names) <= set(MODELS), names
    metafunc.parametrize("bundled_model", names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def bundled_model(request: pytest.FixtureRequest) -> str:
    """The bundled model's name, for `--model`."""
    return str(request.param)


@pytest.fixture(scope="session")
def model_facts(bundled_model: str) -> ModelFacts:
    return FACTS[bundled_model]


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    """One real server per bundled model, shared by the tests of a session."""
    tmp = tmp_path_factory.mktemp(f"server-{bundled_model}")
    with run_server(tmp, "--model", bundled_model, "--n-ctx", "8192") as running:
        yield running


@pytest.fixture
def fresh_server(tmp_path: Path, bundled_model: str) -> Iterator[RunningServer]:
    """A server of its own, for tests that compare two requests' sampled text exactly:
    where earlier requests left holes in the KV cache changes a request's logits a little
    (README, Known limits), enough to flip a seeded or greedy token now and then."""
    with run_server(tmp_path, "--model", bundled_model, "--n-ctx", "4096") as running:
        yield running


@pytest.fixture(scope="session")
def chat_server(server: RunningServer) -> RunningServer:
    """The server itself: both bundled models chat out of the box (Gemma 3 with the
    template llama-srb ships, SmolLM2 with its GGUF's own)."""
    return server


@pytest.fixture(scope="session")
def fuzz_server(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str
) -> Iterator[RunningServer]:
    """A small server for the fuzzers (test_fuzz.py, test_crash_fuzz.py): a small context
    and `n`, so that what they generate is refused or served quickly."""
    with run_server(
        tmp_path_factory.mktemp(f"fuzz-{bundled_model}"),
        "--model",
        bundled_model,
        "--n-ctx",
        "1024",
        "--max-n",
        "4",
        "--max-sequences",
        "8",
        "--request-timeout",
        "120",
    ) as running:
        yield running
    assert running.process.poll() is None or running.process.returncode == 0

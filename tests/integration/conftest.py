from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llama_srb.testing import RunningServer, run_server

# The browser for the UI tests (test_ui_*.py), launched once per session.
from tests.integration.ui_helpers import browser, open_ui  # noqa: F401


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One real server with the default model, shared by the tests of a session."""
    with run_server(tmp_path_factory.mktemp("server"), "--n-ctx", "8192") as running:
        yield running


CHAT_TEMPLATE = Path(__file__).parents[1] / "data" / "gemma3_chat_template.jinja"


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The default model with Gemma 3's chat template: the bundled base model has none."""
    tmp = tmp_path_factory.mktemp("chat_server")
    with run_server(tmp, "--n-ctx", "4096", "--chat-template", str(CHAT_TEMPLATE)) as running:
        yield running


@pytest.fixture(scope="session")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A small server for the fuzzers (test_fuzz.py, test_crash_fuzz.py): a small context
    and `n`, so that what they generate is refused or served quickly."""
    with run_server(
        tmp_path_factory.mktemp("fuzz"),
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

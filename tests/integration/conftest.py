from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llama_srb.testing import RunningServer, run_server


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

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llama_srb.testing import RunningServer, run_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One real server with the default model, shared by the tests of a session."""
    with run_server(tmp_path_factory.mktemp("server"), "--n-ctx", "8192") as running:
        yield running

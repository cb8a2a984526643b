"""The default model split over two llama.cpp rpc-server workers on loopback (`--rpc`,
`--n-gpu-layers`): it generates what the local model does, and the workers hold its layers.

`make test` builds llama.cpp's rpc-server from the same llama-cpp-python source and passes
its path in LLAMA_SRB_RPC_SERVER.
"""

from __future__ import annotations

import re
import subprocess
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import RPC_SERVER, run_rpc_worker
from tests.support.server import RunningServer, run_server

pytestmark = pytest.mark.skipif(
    not Path(RPC_SERVER).is_file(), reason="run through `make test`, which builds rpc-server"
)
ARGS = ("--n-ctx", "2048", "--max-n", "4", "--max-sequences", "8")
PROMPT = "The lighthouse keeper climbed the stairs one last time and"


def resident_mib(process: subprocess.Popen[bytes]) -> float:
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def greedy(server: RunningServer) -> list[str]:
    body = {"prompt": PROMPT, "n": 4, "max_tokens": 24, "temperature": 0}
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return [choice["text"] for choice in response.json()["choices"]]


def test_a_model_split_over_two_workers_generates_what_the_local_one_does(
    tmp_path: Path, bundled_model: str
) -> None:
    args = ("--model", bundled_model, *ARGS)
    with run_server(tmp_path, *args) as local:
        expected = greedy(local)
    with ExitStack() as stack:
        workers = [stack.enter_context(run_rpc_worker(tmp_path)) for _ in range(2)]
        idle = [resident_mib(process) for _, process in workers]
        endpoints = ",".join(endpoint for endpoint, _ in workers)
        split = stack.enter_context(
            run_server(tmp_path, *args, "--rpc", endpoints, "--n-gpu-layers", "99")
        )
        assert greedy(split) == expected
        # The workers hold the layers: each grew by tens of MiB (the models are 240 and
        # 98 MiB).
        grew = [resident_mib(p) - before for (_, p), before in zip(workers, idle, strict=True)]
        assert min(grew) > 20, grew


def test_an_unreachable_worker_stops_the_start_with_a_message(tmp_path: Path) -> None:
    """Stopped before a model is loaded: it runs once, on the default model's flags."""
    unreachable = pytest.raises(
        RuntimeError, match=r"cannot reach the rpc-server at 127\.0\.0\.1:9\b"
    )
    with unreachable, run_server(tmp_path, *ARGS, "--rpc", "127.0.0.1:9"):
        pass

"""The real server (the CLI, in a subprocess) on a free local port: for tests and benchmarks."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import httpx

from tests.support.processes import HttpProcess, free_port, healthy, running


class RunningServer(HttpProcess):
    @cached_property
    def model_id(self) -> str:
        """The id the server serves its model under (`/v1/models`), as clients read it."""
        models = httpx.get(f"{self.api_url}/models", timeout=10).json()
        return str(models["data"][0]["id"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, within: float = 60) -> float:
        """One sample of the Prometheus /metrics endpoint. The engine's samples come from
        the snapshot it publishes after a step: a scrape right after the start may come
        before the first (seconds before, on a busy machine), so a missing one is waited
        for."""
        deadline = time.monotonic() + within
        while True:
            text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
            for line in text.splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
            if time.monotonic() > deadline:
                raise KeyError(f"{name} not in /metrics")
            time.sleep(0.1)

    def metrics(self) -> dict[str, float]:
        """Every sample of one /metrics scrape, keyed by name with its labels as printed."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        return {name: float(value) for name, value in samples}


@contextmanager
def run_server(
    tmp_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    checkout: Path | None = None,
) -> Iterator[RunningServer]:
    """The server on `port` (default: a free one). Its story library and its disk cache
    tier are in `tmp_dir` unless `args` name a --data-dir or a --cache-dir: a test never
    writes the user's own. `checkout`:
    run that llama-srb source tree's server instead of this one (a benchmark's before)."""
    port = port or free_port()
    log_path = tmp_dir / f"server-{port}.log"
    own = []  # the story library and the disk cache tier: never the user's own
    if "--data-dir" not in args and checkout is None:  # an older checkout may not know it
        own += ["--data-dir", str(tmp_dir / "data")]
    if "--cache-dir" not in args and checkout is None:
        own += ["--cache-dir", str(tmp_dir / f"kv-{port}")]
    cmd = [sys.executable, "-m", "llama_srb.cli", "serve", "--port", str(port), *own, *args]
    base_url = f"http://127.0.0.1:{port}"

    env = {**os.environ, **(env or {})}
    if checkout is not None:  # `python -m` finds the package in its working directory first
        env["PYTHONPATH"] = str(checkout)
    with running(cmd, log_path, healthy(base_url), timeout=120, env=env, cwd=checkout) as process:
        yield RunningServer(base_url, process, log_path)

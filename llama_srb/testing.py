"""Run the real server (the CLI, in a subprocess) on a free local port: for tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    @cached_property
    def model_id(self) -> str:
        """The id the server serves its model under (`/v1/models`), as clients read it."""
        models = httpx.get(f"{self.api_url}/models", timeout=10).json()
        return str(models["data"][0]["id"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """One sample of the Prometheus /metrics endpoint."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(f"{name} not in /metrics")

    def metrics(self) -> dict[str, float]:
        """Every sample of one /metrics scrape, keyed by name with its labels as printed."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        samples = (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        return {name: float(value) for name, value in samples}


@contextmanager
def run_server(
    tmp_dir: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """The server's disk cache tier lives under `tmp_dir` unless `args` name a
    --cache-dir: tests never write the user's cache."""
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    if "--cache-dir" not in args:
        args = ("--cache-dir", str(tmp_dir / f"kv-{port}"), *args)
    cmd = [sys.executable, "-m", "llama_srb.cli", "serve", "--port", str(port), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    server = RunningServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{server.log()}")
            try:
                if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready in time:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()

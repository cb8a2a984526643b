"""A helper process (the server, nginx, rpc-server) for tests and benchmarks: started with
its output in a log file, waited for until it is ready, and always stopped."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class HttpProcess:
    """A running process that serves HTTP: where, and its log."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(
    cmd: Sequence[str],
    log_path: Path,
    ready: Callable[[], bool],
    timeout: float,
    env: dict[str, str] | None = None,
    stop_timeout: float = 30,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` running until the block ends; `ready()` (which may raise OSError, as a
    refused connection does) is polled until true. It exiting first, or not being ready
    within `timeout` seconds, is an error that quotes its log."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited early:\n{_tail(log_path)}")
            try:
                if ready():
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd[0]} not ready in {timeout} s:\n{_tail(log_path)}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def healthy(base_url: str) -> Callable[[], bool]:
    """A `ready` check: the server's /health answers 200."""

    def ready() -> bool:
        try:
            return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    return ready


def _tail(log_path: Path, chars: int = 20_000) -> str:
    return log_path.read_text(errors="replace")[-chars:]

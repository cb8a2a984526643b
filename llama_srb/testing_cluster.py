"""The other processes of a cluster, on loopback, for tests and benchmarks: deploy/nginx.conf
in front of running servers, and llama.cpp rpc-server workers."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from llama_srb.testing import free_port

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass
class RunningBalancer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"


def balancer_config(listen_port: int, replicas: Sequence[str]) -> str:
    """deploy/nginx.conf with its listen port and its upstream replaced by `replicas`
    (host:port each); everything else exactly as shipped."""
    text = CONFIG.read_text()
    line = re.compile(r"^(\s*)server \S+ (.*)# replica\n", re.MULTILINE)
    first = line.search(text)
    assert first is not None, f"{CONFIG} has no `server ... # replica` line"
    indent, options = first.groups()
    upstream = "".join(f"{indent}server {r} {options}# replica\n" for r in replicas)
    text = text[: first.start()] + upstream + line.sub("", text[first.start() :])
    return re.sub(r"listen \S+;", f"listen 127.0.0.1:{listen_port};", text, count=1)


@contextmanager
def run_balancer(tmp_dir: Path, replicas: Sequence[str]) -> Iterator[RunningBalancer]:
    """nginx on a free port in front of `replicas` (host:port each)."""
    port = free_port()
    prefix = tmp_dir / f"nginx-{port}"
    prefix.mkdir(parents=True)
    config = prefix / "nginx.conf"
    config.write_text(balancer_config(port, replicas))
    log_path = prefix / "nginx.log"
    with log_path.open("wb") as log:
        cmd = [NGINX, "-c", str(config), "-p", f"{prefix}/", "-g", "daemon off;"]
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    balancer = RunningBalancer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"nginx exited early:\n{log_path.read_text()}")
            try:
                httpx.get(f"{balancer.base_url}/health", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield balancer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


# Built by `make test` / `make rpc-worker` and passed in by the Makefile.
RPC_SERVER = os.environ.get("LLAMA_SRB_RPC_SERVER", "")


@contextmanager
def run_rpc_worker(tmp_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama.cpp's rpc-server on a free port: its host:port and its process."""
    port = free_port()
    with (tmp_dir / f"rpc-{port}.log").open("wb") as log:
        process = subprocess.Popen(
            [RPC_SERVER, "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rpc-server did not start on port {port}") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(timeout=10)

"""The other processes of a cluster, on loopback, for tests and benchmarks: deploy/nginx.conf
in front of running servers, and llama.cpp rpc-server workers."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.processes import HttpProcess, free_port, running

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


RunningBalancer = HttpProcess


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
    base_url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            httpx.get(f"{base_url}/health", timeout=2)  # any answer: nginx is listening
            return True
        except httpx.TransportError:
            return False

    cmd = [NGINX, "-c", str(config), "-p", f"{prefix}/", "-g", "daemon off;"]
    log_path = prefix / "nginx.log"
    with running(cmd, log_path, ready, timeout=30, stop_timeout=10) as process:
        yield RunningBalancer(base_url, process, log_path)


# Built by `make test` / `make rpc-worker` and passed in by the Makefile.
RPC_SERVER = os.environ.get("LLAMA_SRB_RPC_SERVER", "")


@contextmanager
def run_rpc_worker(tmp_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """llama.cpp's rpc-server on a free port: its host:port and its process."""
    port = free_port()

    def ready() -> bool:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True

    cmd = [RPC_SERVER, "--host", "127.0.0.1", "--port", str(port)]
    with running(cmd, tmp_dir / f"rpc-{port}.log", ready, timeout=30, stop_timeout=10) as process:
        yield f"127.0.0.1:{port}", process

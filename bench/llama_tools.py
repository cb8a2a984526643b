"""llama.cpp's own programs beside ours, on the same model and the same context shape:
llama-server and llama-batched-bench as `make llama-tools` builds them from the sources of
the llama.cpp in our wheel (`make llama-tools GPU=cuda`: the CUDA build, in its own folder).

Both get what our server's context gets (llama_srb/native.py `Context`): the same cells,
threads, batch and micro-batch (our n_ubatch is n_batch), a unified KV cache (`-kvu`),
full-size sliding-window layers (`--swa-full`) and every layer offloaded where a GPU is.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import healthy, running
from tests.support.server import RunningServer, free_port

TOOLS = Path.home() / ".cache/llama-srb/llama-tools-0.3.36/bin"


@dataclass(frozen=True)
class Shape:
    """The context both sides get; `n_ctx` is read from our server (`kv_cells_total`)."""

    n_ctx: int
    threads: int = os.cpu_count() or 1
    n_batch: int = 512

    def args(self) -> list[str]:
        return [
            *("-c", str(self.n_ctx), "-b", str(self.n_batch), "-ub", str(self.n_batch)),
            *("-t", str(self.threads), "-tb", str(self.threads)),
            *("-kvu", "--swa-full", "-ngl", "all"),
        ]


@contextlib.contextmanager
def llama_server(
    tools: Path, model: Path, shape: Shape, slots: int, log_dir: Path, *extra: str
) -> Iterator[str]:
    """llama-server on a free port with `slots` slots (`-np`); yields its base URL."""
    port = free_port()
    cmd = [
        str(tools / "llama-server"),
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *shape.args(),
        *("-np", str(slots), *extra),
    ]
    base = f"http://127.0.0.1:{port}"

    with running(cmd, log_dir / f"llama-server-{port}.log", healthy(base), timeout=120):
        yield base


@dataclass(frozen=True)
class DecodeOnly:
    """One row of llama-batched-bench: seconds for the prompt, the steps, and both."""

    prompt: float
    steps: float
    total: float


def batched_bench(
    tools: Path, model: Path, shape: Shape, prompt: int, new_tokens: int, ns: list[int]
) -> dict[int, DecodeOnly]:
    """llama-batched-bench with one shared prompt (`-pps`): each n's prompt decoded once,
    then `new_tokens` steps of n rows, random tokens, no sampling."""
    cmd = [
        str(tools / "llama-batched-bench"),
        *("-m", str(model), *shape.args()),
        *("-npp", str(prompt), "-ntg", str(new_tokens), "-npl", ",".join(map(str, ns))),
        *("-pps", "--output-format", "jsonl"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    found = {
        int(row["pl"]): DecodeOnly(float(row["t_pp"]), float(row["t_tg"]), float(row["t"]))
        for row in rows
    }
    missing = set(ns) - set(found)
    assert not missing, f"llama-batched-bench skipped n={sorted(missing)} (context too small?)"
    return found


@dataclass(frozen=True)
class EngineClock:
    """Our engine's own account of its time, from /metrics; subtract two for one request's."""

    steps: float
    decode_seconds: float
    host_seconds: float  # llama_srb_host_step_seconds: per step, the time outside llama_decode
    drawn: float  # tokens sampled

    @classmethod
    def read(cls, server: RunningServer) -> EngineClock:
        metrics = server.metrics()
        return cls(
            metrics["llama_srb_decode_steps_total"],
            metrics["llama_srb_decode_seconds_total"],
            metrics.get("llama_srb_host_step_seconds_sum", float("nan")),  # not before 24
            metrics.get("llama_srb_generated_tokens_total", float("nan")),
        )

    def __sub__(self, earlier: EngineClock) -> EngineClock:
        return EngineClock(
            self.steps - earlier.steps,
            self.decode_seconds - earlier.decode_seconds,
            self.host_seconds - earlier.host_seconds,
            self.drawn - earlier.drawn,
        )

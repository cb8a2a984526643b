"""Worker threads for the heavy part of preparing a request, off the event loop.

Tokenizing megabytes, parsing a grammar, converting a JSON schema and building n sampler
chains take from milliseconds to seconds; on the event loop they would freeze every other
client (`/health` included). The threads have the big stack llama.cpp's recursive grammar
parser needs (native.py).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from llama_srb.native import native_thread

T = TypeVar("T")

_Job = tuple[Future[Any], Callable[[], Any]]


class Workers:
    """A fixed set of daemon threads that run blocking jobs for the event loop."""

    def __init__(self, count: int) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [native_thread(self._work, f"llama-srb-prepare-{i}") for i in range(count)]

    async def run(self, job: Callable[[], T], discard: Callable[[T], None] | None = None) -> T:
        """`job()`'s result. If the caller is cancelled meanwhile (client gone), the job
        still finishes and `discard` frees what it built (native samplers)."""
        future: Future[T] = Future()
        self._jobs.put((future, job))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if discard is not None:
                future.add_done_callback(lambda done: _discard_result(done, discard))
            raise

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started: nothing was built
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the awaiting request, not lost
                future.set_exception(exc)


def _discard_result(future: Future[T], discard: Callable[[T], None]) -> None:
    if not future.cancelled() and future.exception() is None:
        discard(future.result())

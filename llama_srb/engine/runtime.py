"""The engine thread, and the thread-safe doorway to it.

llama.cpp contexts are not thread-safe, so one thread owns the engine and runs its loop.
The asyncio side only submits closures (add, abort) and reads per-request queues that the
engine fills through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable

from llama_srb.engine.engine import Engine
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.sequence import Request

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._inbox: deque[Callable[[], None]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="llama-srb-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Abort whatever is in flight and join the engine thread."""
        self._call(lambda: self.engine.fail_all("the server is shutting down"))
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def abort(self, request_id: str) -> None:
        self._call(lambda: self.engine.abort(request_id))

    async def generate(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its outputs until it finishes.

        Leaving the iteration early (client disconnect, cancellation) aborts the request,
        so its sequences leave the batch before the next decode step.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def sink(output: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is listening
                loop.call_soon_threadsafe(queue.put_nowait, output)

        request.sink = sink
        self._call(lambda: self.engine.add(request))
        finished = False
        try:
            while not finished:
                output = await queue.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(request.request_id)

    def _call(self, fn: Callable[[], None]) -> None:
        self._inbox.append(fn)
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.clear()
            while self._inbox:
                self._inbox.popleft()()
            if self._stopping:
                return
            try:
                busy = self.engine.step()
            except Exception as exc:  # keep serving: fail what was in flight, not the server
                log.exception("engine step failed")
                self.engine.fail_all(f"engine error: {exc}")
                busy = False
            if not busy:
                self._wake.wait()

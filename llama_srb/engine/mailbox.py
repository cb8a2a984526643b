"""The engine thread's way to the event loop: callbacks in a queue, and a pipe the event
loop watches, woken with the GIL held.

`loop.call_soon_threadsafe` wakes the event loop with `socket.send`, which lets go of the
GIL. The event loop's thread, woken by that very byte, took the GIL first, and the engine
waited for it to handle every output before its next llama_decode could start (measured:
1.4-1.7 ms a step with 64 streams, 0.02 ms of host time a branch-step). Here the byte goes
out through libc's `write` called with the GIL held (ctypes.PyDLL), so that the engine
goes on to llama_decode, which lets go of the GIL, and the readers' work runs beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

_write = ctypes.PyDLL(None).write  # PyDLL: called without letting go of the GIL
_write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_write.restype = ctypes.c_ssize_t


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # called from no event loop's thread
        return None


class Mailbox:
    """Callbacks that any thread posts, run on the event loop in the order posted. The
    pipe lives as long as the mailbox; `watch` has an event loop read it (the newest one
    to call it: a runtime outlives the loop of a test); `close` once nothing posts."""

    def __init__(self) -> None:
        self._callbacks: deque[Callable[[], None]] = deque()
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False  # its pipe is gone, or going: nothing is written to it

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Event-loop thread: this loop runs what is posted from now on."""
        if loop is self._loop or self._closed:
            return
        self._unwatch()
        loop.add_reader(self._read_fd, self._run)
        self._loop = loop

    def post(self, callback: Callable[[], None]) -> None:
        """Any thread: `callback` runs on the watching event loop soon."""
        self._callbacks.append(callback)
        if not self._closed:  # (a closed descriptor's number may be another file's now)
            _write(self._write_fd, b"\0", 1)  # a full pipe (-1, EAGAIN): a wake-up pends

    def close(self) -> None:
        """Once no thread posts any more: what was posted runs, and the pipe goes, on the
        watching event loop's thread (the loop's map of what it watches is its own)."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        if loop is None or loop.is_closed():  # nothing watches it, or can run a callback
            self._close(run=False)
        elif _running_loop() is loop:
            self._close(run=True)
        else:
            try:
                loop.call_soon_threadsafe(self._close, True)
            except RuntimeError:  # the loop closed meanwhile
                self._close(run=False)

    def _close(self, run: bool) -> None:
        if run:
            self._run()
        self._unwatch()
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._read_fd)

    def _run(self) -> None:
        """Event-loop thread: the pipe is readable; empty it, then run what was posted
        (a callback posted after the read has its own byte, and runs now or next time)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass
        callbacks = self._callbacks
        while callbacks:
            try:
                callbacks.popleft()()
            except Exception:  # as the event loop does with its own: the others still run
                log.exception("a callback from the engine thread failed")

"""Graceful shutdown: on SIGTERM keep listening but take no new generations (503, and
/health answers 503 `draining` so load balancers move on), let running requests finish
for up to --shutdown-grace seconds, end the rest with an explicit error, then close.

Exit status: 0 after a clean drain; 1 if the engine thread died, or if it was stuck in a
native call at the end (it cannot be stopped: the process exits around it, within the
grace period plus a few seconds).

uvicorn would close the listening socket at once (so the 503 `draining` is never seen),
cut open responses at its own timeout (streams without `[DONE]`) and re-raise SIGTERM
once done (status 143); the server below drains first and exits with the status above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from types import FrameType

import uvicorn

from llama_srb.api.state import AppState

# uvicorn's own last resort once drained: open connections get this long to finish.
BACKSTOP_S = 10.0
EXIT_FAILED = 1


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        config.timeout_graceful_shutdown = int(BACKSTOP_S)
        super().__init__(config)
        self.state = state

    async def on_tick(self, counter: int) -> bool:
        # The engine thread died: nothing can be served, so exit (non-zero, see `serve`).
        return self.state.engine_failure is not None or await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Drain while still listening; a second signal (force_exit) ends the grace now.
        drain = asyncio.create_task(self.state.drain())
        while not drain.done():
            if self.force_exit:
                self.state.hurry()
            await asyncio.wait({drain}, timeout=0.1)
        await super().shutdown(sockets)


def _exit(state: AppState) -> None:
    if state.stuck_at_exit:
        # The engine thread is inside a native call that will not return: interpreter
        # shutdown would wait for it or free what it uses. Leave now, logs flushed.
        logging.shutdown()
        os._exit(EXIT_FAILED)
    if state.engine_failure is not None:
        sys.exit(f"llama-srb: {state.engine_failure}")


def serve(config: uvicorn.Config, state: AppState) -> None:
    """Run until SIGTERM or SIGINT, shutting down gracefully; returns normally after a
    clean drain, else exits with EXIT_FAILED (see the module's docstring)."""

    def after_shutdown(_signum: int, _frame: FrameType | None) -> None:
        _exit(state)
        sys.exit(0)

    # uvicorn restores the previous handler and re-raises the signal after its graceful
    # shutdown: make that our exit instead of death by signal.
    signal.signal(signal.SIGTERM, after_shutdown)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT is re-raised the same way
        GracefulServer(config, state).run()
    _exit(state)

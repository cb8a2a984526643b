"""Graceful shutdown: on SIGTERM stop accepting, let running requests finish for up to
--shutdown-grace seconds, end the rest with an explicit error, exit 0.

uvicorn already closes the listening socket and waits for open responses; what it lacks
is ending those responses cleanly when the grace period is over (its own timeout just
cancels them, cutting streams without `[DONE]`) and exiting with status 0 after a
SIGTERM (it re-raises the signal once done, which kills the process with status 143).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from types import FrameType

import uvicorn

from llama_srb.api.state import AppState

# uvicorn's own last resort, if a response outlives our grace period regardless.
BACKSTOP_S = 10.0


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        config.timeout_graceful_shutdown = int(state.settings.shutdown_grace + BACKSTOP_S)
        super().__init__(config)
        self.state = state

    async def on_tick(self, counter: int) -> bool:
        # The engine thread died: nothing can be served, so exit (non-zero, see `serve`).
        return self.state.engine_failure is not None or await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Drain alongside uvicorn's wait for open connections, so that wait ends on time.
        drain = asyncio.create_task(self.state.drain())
        await super().shutdown(sockets)
        await drain


def _exit_quietly(_signum: int, _frame: FrameType | None) -> None:
    sys.exit(0)


def serve(config: uvicorn.Config, state: AppState) -> None:
    """Run until SIGTERM or SIGINT, shutting down gracefully; returns normally. Exits
    with an error if the engine thread died."""
    # uvicorn restores the previous handler and re-raises the signal after its graceful
    # shutdown: make that a clean exit instead of death by signal.
    signal.signal(signal.SIGTERM, _exit_quietly)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT is re-raised the same way
        GracefulServer(config, state).run()
    if state.engine_failure is not None:
        sys.exit(f"llama-srb: {state.engine_failure}")

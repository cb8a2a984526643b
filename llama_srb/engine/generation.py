"""One submitted request as the event loop sees it: its outputs, its deadline, its end.

Lives on the asyncio side of the runtime, which fills its queue with the outputs the
engine thread hands over.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from llama_srb.engine.outputs import RequestOutput


class Interrupted(Exception):
    """The runtime ended a request before the engine finished it; the subclass says why
    (the API maps each to its HTTP status and error code)."""


class RequestTimedOut(Interrupted):
    """The request ran past its deadline."""


class ShuttingDown(Interrupted):
    """The server is shutting down."""


class Unloaded(Interrupted):
    """Its model was unloaded for another before it ended (--unload-grace over)."""


class EngineDied(Interrupted):
    """The engine thread is gone."""


@dataclass(eq=False)
class Flight:
    """A submitted request as the event loop knows it: its id, its client, the queue its
    outputs arrive on, and what they said so far (event-loop thread only; the request
    itself belongs to the engine thread)."""

    request_id: str
    client: str
    queue: asyncio.Queue[RequestOutput | Interrupted] = field(default_factory=asyncio.Queue)
    waiting: bool = True  # not admitted yet: it counts against --max-queue
    done: bool = False  # the engine published the request's final output


class Generation:
    """The outputs of one submitted request, as an async iterator.

    Leaving early (client gone, task cancelled, deadline passed) aborts the request, so
    its sequences leave the batch before the next decode step. Interruptions by the
    runtime (timeout, shutdown) are raised as `Interrupted` for the API to report.
    """

    def __init__(
        self,
        flight: Flight,
        timeout: float | None,
        release: Callable[[Flight], None],
    ) -> None:
        self._flight = flight
        self._timeout = timeout
        self._deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        self._release = release
        self._closed = False

    @property
    def request_id(self) -> str:
        return self._flight.request_id

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._closed:
            raise StopAsyncIteration
        try:
            async with asyncio.timeout_at(self._deadline):
                item = await self._flight.queue.get()
        except TimeoutError:
            self.close()
            raise RequestTimedOut(
                f"the request ran past the server's request timeout ({self._timeout:g} s)"
            ) from None
        except BaseException:  # cancelled: the client went away
            self.close()
            raise
        if isinstance(item, Interrupted):
            self.close()
            raise item
        if item.finished:
            self.close()
        return item

    def close(self) -> None:
        """Stop reading; aborts the request unless the engine already finished it."""
        if not self._closed:
            self._closed = True
            self._release(self._flight)

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        # A stream dropped before its first read (client gone before the response body
        # began) never reaches `close`; without this its request would run for nobody.
        with contextlib.suppress(Exception):
            self.close()

"""The engine thread, and the thread-safe doorway to it.

llama.cpp contexts are not thread-safe, so one thread owns the engine and runs its loop.
The asyncio side only submits closures (add, abort) and reads per-request queues; the
engine thread hands each batch of outputs the engine returns to the event loop at once
(engine/mailbox.py, which keeps the GIL while it wakes the event loop), which routes them
to their readers. A step's progress goes when the next llama_decode starts, so that the
readers' work (a stream's events) runs beside it and not between two decodes. A request's
ownership moves with `generate`: from then on the event loop knows its id, its client and
what its outputs said (engine/generation.py Flight), never the request itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from llama_srb.engine.build import Built, Submission
from llama_srb.engine.engine import Engine
from llama_srb.engine.generation import (
    EngineDied,
    Flight,
    Generation,
    Interrupted,
    ShuttingDown,
)
from llama_srb.engine.mailbox import Mailbox
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.request import Branch, Request
from llama_srb.engine.spec import unit_of
from llama_srb.native import native_thread, release_free_memory
from llama_srb.sampling.branch import BranchSampler

log = logging.getLogger(__name__)

Work = Callable[[], list[RequestOutput]]  # a closure the engine thread runs
T = TypeVar("T")


def _settle(future: asyncio.Future[T], result: T | None, error: Exception | None) -> None:
    """Event-loop thread: an engine-thread action's result, unless its caller left."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


class Runtime:
    """`on_death(reason)` is called on the engine thread if it ever dies: the server
    cannot serve without it and should fail its clients at once and exit."""

    def __init__(self, engine: Engine, on_death: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self._inbox: deque[Work] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._on_death = on_death
        self._thread: threading.Thread | None = None
        # Submitted requests not yet finished, keyed by request id (event-loop thread only).
        self._flights: dict[str, Flight] = {}
        self._mailbox = Mailbox()  # to the readers' event loop
        self.closing = False  # draining for shutdown: new requests are refused
        self._hurry = False  # end the drain now (a second signal)
        self.died: str | None = None  # why the engine thread ended unasked, once it has
        self._warm = threading.Event()  # the engine thread's first decode is done
        # Engine thread only: the last step's progress, until the engine's next handover.
        self._progress: list[RequestOutput] = []
        engine.handover = self._hand_over

    def start(self) -> None:
        """Start the engine thread; return once its first decode is done (or it died), so
        that a model counts as loaded, and /health as ok, when it serves at full pace: a
        request sent at once paid ~0.5 s for that decode (Gemma 3, this CPU)."""
        # A big stack: llama.cpp's grammar sampler recurses once per nesting level.
        self._thread = native_thread(self._run, "llama-srb-engine")
        self._warm.wait()

    @property
    def waiting(self) -> int:
        """Submitted requests not admitted yet: the queue that --max-queue bounds."""
        return sum(f.waiting for f in self._flights.values())

    def waiting_of(self, client: str) -> int:
        """Those of one client's unit (a session's address: engine/share.py): what
        --client-max-queue bounds."""
        unit = unit_of(client)
        return sum(f.waiting and unit_of(f.client) == unit for f in self._flights.values())

    @property
    def in_flight(self) -> int:
        """Submitted requests whose outputs are still being read (waiting or running)."""
        return len(self._flights)

    async def drain(
        self, grace: float, ending: Callable[[float], Interrupted] | None = None
    ) -> None:
        """Refuse new requests, give those in flight `grace` seconds, then end the rest with
        `ending(grace)` (default: the server shut down)."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._flights and loop.time() < deadline and not self._hurry:
            await asyncio.sleep(0.05)
        end = ending or _shut_down
        for flight in list(self._flights.values()):
            self._interrupt(flight, end(grace))

    def hurry(self) -> None:
        """End the grace period now."""
        self._hurry = True

    def stop(self, timeout: float | None = None) -> bool:
        """Fail whatever is still in flight (see `drain`) and join the engine thread;
        False if it did not end within `timeout` seconds (stuck in a native call)."""
        self._call(lambda: self.engine.fail_all("the server is shutting down"))
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False  # it may still post: its mailbox stays open
        self._mailbox.close()
        return True

    def abort(self, request_id: str) -> None:
        self._call(lambda: self.engine.abort(request_id))

    async def act(self, action: Callable[[Engine], tuple[T, list[RequestOutput]]]) -> T:
        """Run `action` on the engine thread between two steps (live branching: a drop, a
        steer) and return its result; its outputs go to their readers like a step's. What
        it raises is raised here."""
        loop = asyncio.get_running_loop()
        self._mailbox.watch(loop)
        done: asyncio.Future[T] = loop.create_future()

        def work() -> list[RequestOutput]:
            try:
                result, outputs = action(self.engine)
            except Exception as exc:
                self._mailbox.post(functools.partial(_settle, done, None, exc))
                return []
            self._mailbox.post(functools.partial(_settle, done, result, None))
            return outputs

        self._call(work)
        return await done

    async def drop(self, request_id: str, index: int, refill: Built[Branch] | None) -> int | None:
        """Live branching: end choice `index` now; with `refill`, a fresh one goes on in its
        place (its index is returned). LiveRefused when it cannot."""
        return await self.act(
            lambda engine: engine.drop(request_id, index, refill.take() if refill else None)
        )

    async def steer(
        self, request_id: str, index: int, sampler: Built[BranchSampler] | None, append: list[int]
    ) -> None:
        """Live branching: change choice `index` from its next token. LiveRefused when not."""
        await self.act(
            lambda engine: (
                None,
                engine.steer(request_id, index, sampler.take() if sampler else None, append),
            )
        )

    def generate(self, submission: Submission, timeout: float | None = None) -> Generation:
        """Hand a built request to the engine now and return the iterator of its outputs.

        Submitting at once, not at the first read, lets the queue bound count the request
        before its HTTP response starts. `timeout` counts from here, queueing included.
        """
        self._mailbox.watch(asyncio.get_running_loop())
        request = submission.take()
        flight = Flight(submission.request_id, submission.spec.client)
        self._flights[flight.request_id] = flight
        self._call(lambda: self._add(request))
        if self.closing:  # raced with shutdown: the engine still frees what it built
            self._interrupt(flight, ShuttingDown("the server is shutting down"))
        return Generation(flight, timeout, self._release)

    def _add(self, request: Request) -> list[RequestOutput]:
        try:
            return self.engine.add(request)
        except Exception as exc:  # maybe not tracked by the engine: end it here, for its reader
            self._publish(self.engine.fail([request], f"engine error: {exc}"))
            raise

    def _publish_step(self, outputs: list[RequestOutput]) -> None:
        """Engine thread: a step's outputs. Its progress waits for the engine's next
        handover (`_hand_over`), when llama_decode is about to run; with an ending they
        all go now, as its reader waits for no decode."""
        if any(output.finished for output in outputs):
            self._publish(outputs)
        else:
            self._progress += outputs

    def _hand_over(self) -> None:
        """Engine thread, as the engine is about to wait on llama.cpp: the last step's
        progress goes to the event loop, whose readers' work then runs beside llama_decode,
        not between two decodes (docs/benchmarks.md, "Outputs handed over beside
        llama_decode")."""
        if self._progress:
            self._publish([])

    def _publish(self, outputs: list[RequestOutput]) -> None:
        """Engine thread: hand a batch of outputs to the event loop, in one wake-up, the
        last step's progress first."""
        if self._progress:
            outputs, self._progress = self._progress + outputs, []
        if outputs:
            self._mailbox.post(functools.partial(self._deliver, outputs))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Event-loop thread: each output to its reader's queue (if it still has one)."""
        for output in outputs:
            flight = self._flights.get(output.request_id)
            if flight is None:  # released: its reader is gone
                continue
            flight.waiting = flight.waiting and not (output.admitted or output.finished)
            if output.finished:
                flight.done = True
                del self._flights[output.request_id]
            flight.queue.put_nowait(output)

    def _release(self, flight: Flight) -> None:
        """Its reader is gone: forget the request, aborting it unless already finished."""
        self._flights.pop(flight.request_id, None)
        if not flight.done:
            self.abort(flight.request_id)

    def _interrupt(self, flight: Flight, why: Interrupted) -> None:
        flight.queue.put_nowait(why)
        self.abort(flight.request_id)  # also ends requests whose reader never came

    def fail_flights(self, reason: str) -> None:
        """The engine thread is gone: every reader gets an error now (event-loop thread)."""
        for flight in list(self._flights.values()):
            flight.queue.put_nowait(EngineDied(reason))
        self._flights.clear()

    def _call(self, fn: Work) -> None:
        self._inbox.append(fn)
        self._wake.set()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # nothing can serve now: say so, loudly, at once
            log.critical("the engine thread died", exc_info=True)
            self.died = f"the engine stopped: {type(exc).__name__}: {exc}"
            if self._on_death is not None:
                self._on_death(self.died)
        finally:
            self._warm.set()

    def _loop(self) -> None:
        # The first decode pays for page faults and first-use setup. It runs here, on the
        # thread that will decode from now on: llama.cpp's OpenMP thread team belongs to
        # the thread that first starts it, and decoding from a second thread ran ~1.5x
        # slower (measured: 5.6 s vs 3.7 s for the same 128 tokens).
        self.engine.warm_up()
        self._warm.set()
        worked = False  # since the engine was last idle
        while True:
            self._wake.clear()
            try:
                while self._inbox:
                    self._publish(self._inbox.popleft()())
                if self._stopping:
                    return
                worked |= bool(self.engine.step(self._publish_step))
                busy = self.engine.has_work
            except Exception as exc:  # keep serving: fail what was in flight, not the server
                log.exception("engine step failed")
                self._publish(self.engine.fail_all(f"engine error: {exc}"))
                busy = False
            if not busy:
                self._hand_over()  # no decode comes to carry it
                if worked:  # what the requests freed goes back to the OS, not at their cost
                    release_free_memory()
                    worked = False
                self._wake.wait()


def _shut_down(grace: float) -> Interrupted:
    return ShuttingDown(f"the server shut down (grace period of {grace:g} s over)")

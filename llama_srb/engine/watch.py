"""The engine thread's watchdog: which step runs now, since when, and for whom.

A native call that never returns (a grammar that explodes, a driver that hangs) holds the
engine thread, and nothing in Python can interrupt it. What the server can do is know it:
the engine marks each step's start and end (`StepWatch`, one reference assignment each,
so any thread reads a whole record), and the event loop asks the `Watchdog` whether the
step in progress has run past its bound. Then /health answers 503 (a liveness probe
restarts the replica), /metrics shows the step's age, and the log names the requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Step:
    """One step: written by the engine thread (`ended` once, when it returns)."""

    started: float  # time.monotonic()
    request_ids: tuple[str, ...]
    ended: float | None = None


class StepWatch:
    """The step in progress, if any: set and cleared by the engine thread only."""

    def __init__(self) -> None:
        self.current: Step | None = None
        self.longest = 0.0  # seconds: the longest step so far, to set the bound against

    def begin(self, request_ids: Iterable[str]) -> None:
        self.current = Step(time.monotonic(), tuple(request_ids))

    def end(self) -> None:
        step, self.current = self.current, None
        if step is not None:
            step.ended = time.monotonic()
            self.longest = max(self.longest, step.ended - step.started)


class Watchdog:
    """Judges the engine's step against `bound` seconds (0: never stuck). For the event
    loop only: each step past its bound is counted and logged once, and so is its end."""

    def __init__(self, watch: StepWatch, bound: float) -> None:
        self.watch = watch
        self.bound = bound
        self.episodes = 0  # steps that ran past the bound
        self._reported: Step | None = None  # the step last reported stuck

    def age(self) -> float:
        """Seconds the step in progress has run (0 between steps)."""
        step = self.watch.current
        return 0.0 if step is None else max(0.0, time.monotonic() - step.started)

    def stuck(self) -> Step | None:
        """The step in progress if it has run longer than the bound, else None."""
        step = self.watch.current
        reported = self._reported
        if reported is not None and step is not reported:
            self._reported = None
            took = (reported.ended or time.monotonic()) - reported.started
            log.warning(
                "the engine step of requests %s returned after %.1f s; serving again",
                ", ".join(reported.request_ids) or "(none)",
                took,
            )
        if step is None or self.bound <= 0 or time.monotonic() - step.started <= self.bound:
            return None
        if step is not reported:
            self._reported = step
            self.episodes += 1
            log.error(
                "the engine has been in one step for over %g s (--stuck-after): requests %s;"
                " /health answers 503 until it returns",
                self.bound,
                ", ".join(step.request_ids) or "(none)",
            )
        return step

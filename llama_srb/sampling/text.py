"""A branch's text stream: tokens in, safe text out (UTF-8 complete, stop strings held)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llama_srb.sampling.detok import IncrementalDetokenizer
from llama_srb.sampling.stops import StopMatcher


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stops: Sequence[str]) -> None:
        self._detok = IncrementalDetokenizer(piece)
        self._stops = StopMatcher(stops)

    @property
    def stopped(self) -> bool:
        """A stop string appeared: the branch must end, its text is complete."""
        return self._stops.stopped

    def push(self, token: int, check_stops: bool) -> str:
        return self._stops.push(self._detok.push(token), check_stops)

    def flush(self) -> str:
        return self._stops.push(self._detok.flush()) + self._stops.flush()

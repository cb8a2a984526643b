"""Stop strings with hold-back: text that might be the start of a stop string is held
until the next piece shows whether it is one, so a stop never leaks, even in part."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed generated text with `push`; it returns what is safe to emit.

    `stopped` becomes True once a stop string appears; the text before it is emitted and
    everything from the stop string on is dropped. `flush` releases what is still held
    when generation ends for another reason.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, text: str, check: bool = True) -> str:
        """Return the text that can be emitted now. With `check` False (before
        `min_tokens` is reached) stop strings are not looked for."""
        if self.stopped:
            return ""
        if not self.stops or not check:
            out, self._held = self._held + text, ""
            return out
        buffer = self._held + text
        cut = self._first_stop(buffer)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return buffer[:cut]
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return "" if self.stopped else out

    def _first_stop(self, buffer: str) -> int | None:
        positions = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        return min(positions) if positions else None

    def _partial_suffix(self, buffer: str) -> int:
        return partial_suffix(buffer, self.stops)


def partial_suffix(buffer: str, phrases: Sequence[str]) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of a phrase.
    Only positions holding a phrase's first character can start one: `find` jumps
    between them in C, so long phrases cost little per token."""
    longest = 0
    for phrase in phrases:
        start = max(0, len(buffer) - len(phrase) + 1)
        i = buffer.find(phrase[0], start)
        while i >= 0 and len(buffer) - i > longest:
            if phrase.startswith(buffer[i:]):
                longest = len(buffer) - i  # the earliest match is this phrase's longest
                break
            i = buffer.find(phrase[0], i + 1)
    return longest

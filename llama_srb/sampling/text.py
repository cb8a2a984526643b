"""A branch's text stream: tokens in, safe text out (UTF-8 complete, stop strings held,
and with banned phrases, text that could begin one held too)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llama_srb.sampling.banned import PhraseGuard
from llama_srb.sampling.detok import IncrementalDetokenizer
from llama_srb.sampling.patterns import PatternSet
from llama_srb.sampling.stops import StopMatcher


class TextStream:
    def __init__(
        self,
        piece: Callable[[int], bytes],
        stops: Sequence[str],
        banned: Sequence[str] = (),
        case_sensitive: bool = False,
        patterns: PatternSet | None = None,
    ) -> None:
        self._detok = IncrementalDetokenizer(piece)
        self._stops = StopMatcher(stops)
        guarded = banned or patterns is not None
        self._guard = PhraseGuard(banned, case_sensitive, patterns) if guarded else None
        self._pushed = 0

    @property
    def stopped(self) -> bool:
        """A stop string appeared: the branch must end, its text is complete."""
        return self._stops.stopped

    @property
    def released(self) -> int:
        """Tokens whose text has gone out (the rest may still be taken back)."""
        return self._pushed if self._guard is None else self._guard.released

    @property
    def banned_at(self) -> int | None:
        """After a push: the index of the token a banned phrase began in, or None."""
        return None if self._guard is None else self._guard.banned_at

    def push(self, token: int, check_stops: bool, final: bool = False) -> str:
        """`final`: the branch ends after this token (banned patterns are judged at the
        real end of its text)."""
        guard = self._guard
        if guard is None:
            self._pushed += 1
            return self._stops.push(self._detok.push(token), check_stops)
        # Stop strings see released text only: it is never taken back.
        state = self._detok.state()
        text = guard.push(self._detok.push(token), state, final)
        return self._stops.push(text, check_stops)

    def end_banned_at(self) -> int | None:
        """The branch would end here (end of generation): the index of the token a banned
        pattern's match, judged at the real end, began in, or None (`banned_at` too)."""
        return None if self._guard is None else self._guard.end()

    def rewind(self, index: int) -> None:
        """Back to before token `index` (a banned phrase began in it)."""
        assert self._guard is not None
        self._detok.restore(self._guard.rewind(index))

    def flush(self) -> str:
        rest = self._detok.flush()
        if self._guard is not None:
            rest = self._guard.flush(rest)
        return self._stops.push(rest) + self._stops.flush()

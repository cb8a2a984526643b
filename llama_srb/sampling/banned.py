"""Banned phrases: a branch's text is held back until it cannot be the start of one, and
when one appears the branch is rewound to the token where it began (the engine does the
rewind: KV cells, tokens, sampler history; this module finds where and bans the token).

Text is released at token boundaries only: a phrase can begin in the middle of a token
(" shiv" + "ers"), and the part of that token before the phrase must not have been shown
if the token is taken back. So whatever could still grow into a phrase is held from the
start of the token it begins in, and a phrase found is always in text never shown.

Banned patterns (`banned_regex`, sampling/patterns.py) are held the same way: from the
earliest place a match could still begin, but never more than MAX_HOLD_CHARS back.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from llama_srb.sampling.patterns import MAX_HOLD_CHARS, PatternSet
from llama_srb.sampling.stops import partial_suffix

# A position whose candidates keep starting banned phrases (every way to spell the word
# tried in turn) ends its branch there, as does a branch that rewinds without end: the
# bounds keep the work a banned list can cause proportional to the branch's length.
MAX_BANS_PER_POSITION = 16
MAX_REWINDS = 256


def fold(text: str) -> str:
    """Lower case, one character for one (so that offsets in the folded text are offsets
    in the text): the few characters whose lower case is longer stay as they are."""
    folded = text.lower()
    if len(folded) == len(text):
        return folded
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


class PhraseGuard:
    """The text of a branch's tokens not yet released, and where banned phrases (and
    matches of banned patterns) begin.

    `push` takes each token's text (and an opaque state to restore if the branch is
    rewound to before that token) and returns the text that can never become part of a
    banned phrase; `banned_at` is then the index of the token a phrase began in, or None.
    Only the held window is kept: a rewind never reaches released text.
    """

    def __init__(
        self,
        phrases: Sequence[str],
        case_sensitive: bool = False,
        patterns: PatternSet | None = None,
    ) -> None:
        self.case_sensitive = case_sensitive
        self.phrases = tuple(p if case_sensitive else fold(p) for p in phrases if p)
        self.patterns = patterns
        self._context = ""  # the last released character: `\b` at the window's start
        self.released = 0  # tokens whose text is released
        self.banned_at: int | None = None
        self._window = ""  # the held text (from the first held token on)
        self._folded = ""  # the same, case-folded unless case-sensitive
        self._starts: list[int] = []  # offset in the window of each held token's text
        self._states: list[object] = []  # each held token's restore state

    @property
    def held_tokens(self) -> int:
        return len(self._starts)

    def push(self, text: str, state: object, final: bool = False) -> str:
        """With `final`, the branch ends after this text: a pattern's match that needs
        to know what follows (`\\bthe\\b`) is judged at the real end."""
        self._starts.append(len(self._window))
        self._states.append(state)
        self._window += text
        self._folded += text if self.case_sensitive else fold(text)
        hits = [i for i in (self._folded.find(p) for p in self.phrases) if i >= 0]
        held_from = len(self._window) - partial_suffix(self._folded, self.phrases)
        if self.patterns is not None:
            hit, live = self._patterns(final)
            hits += [] if hit is None else [hit]
            held_from = min(held_from, live)
        if hits:
            self.banned_at = self.released + self._token_at(min(hits))
            return ""
        self.banned_at = None
        if held_from == len(self._window):  # nothing could grow into a phrase
            # but a token that gave no text yet (half a character) is held with what follows
            keep = bisect_left(self._starts, held_from)
        else:
            keep = self._token_at(held_from)
        return self._release(keep)

    def end(self) -> int | None:
        """The branch ends with no more text: the index of the token a pattern's match
        (judged at the real end) began in, or None. Sets `banned_at` too."""
        if self.patterns is None or not self._starts:
            return None
        hit, _ = self._patterns(True)
        self.banned_at = None if hit is None else self.released + self._token_at(hit)
        return self.banned_at

    def _patterns(self, final: bool) -> tuple[int | None, int]:
        """Where in the window the earliest pattern match begins (None: none is certain
        yet), and the earliest place one could still begin, at most MAX_HOLD_CHARS back."""
        assert self.patterns is not None
        context = self._context.encode("utf-8", "surrogatepass")
        window = self._window.encode("utf-8", "surrogatepass")
        text, start = context + window, len(context)
        hit = self.patterns.final(text, start) if final else self.patterns.certain(text, start)
        floor = max(0, len(self._window) - MAX_HOLD_CHARS)
        if floor:
            floor = len(self._window[:floor].encode("utf-8", "surrogatepass"))
        live = self.patterns.live(text, start + floor)
        at = None if hit is None else _chars(window, hit - start)
        return at, _chars(window, live - start)

    def rewind(self, index: int) -> object:
        """Forget tokens `index` and after; returns the state pushed with token `index`."""
        j = index - self.released
        assert 0 <= j < len(self._starts), "a rewind never reaches released text"
        cut, state = self._starts[j], self._states[j]
        self._window, self._folded = self._window[:cut], self._folded[:cut]
        del self._starts[j:], self._states[j:]
        self.banned_at = None
        return state

    def flush(self, text: str = "") -> str:
        """The branch ends: the held text (with `text`, the detokenizer's rest) goes out;
        it holds no whole phrase, only the start of one that never came."""
        out = self._window + text
        self._context = out[-1:] or self._context
        self.released += len(self._starts)
        self._window = self._folded = ""
        self._starts, self._states = [], []
        return out

    def _token_at(self, offset: int) -> int:
        """The held token whose text holds character `offset`, moved back over tokens that
        gave no text before it (their bytes may be part of that character)."""
        j = bisect_right(self._starts, offset) - 1
        return bisect_left(self._starts, self._starts[j])

    def _release(self, n_tokens: int) -> str:
        if n_tokens == 0:
            return ""
        cut = self._starts[n_tokens] if n_tokens < len(self._starts) else len(self._window)
        out = self._window[:cut]
        self._context = out[-1:] or self._context
        self._window, self._folded = self._window[cut:], self._folded[cut:]
        self._starts = [s - cut for s in self._starts[n_tokens:]]
        del self._states[:n_tokens]
        self.released += n_tokens
        return out


def _chars(text: bytes, offset: int) -> int:
    """A byte offset into UTF-8 text (RE2's) as a character offset (the window's)."""
    return len(text[:offset].decode("utf-8", "surrogatepass"))


@dataclass
class Bans:
    """The tokens banned at each position of one branch, and its rewinds so far."""

    bans: dict[int, list[int]] = field(default_factory=dict)
    rewinds: int = 0

    def at(self, position: int) -> list[int] | None:
        return self.bans.get(position)

    def ban(self, position: int, token: int) -> bool:
        """Ban `token` at `position` (bans after it no longer apply: what precedes them
        changes). False when a bound is reached: the branch should end there."""
        self.rewinds += 1
        for later in [p for p in self.bans if p > position]:
            del self.bans[later]
        banned = self.bans.setdefault(position, [])
        banned.append(token)
        return len(banned) <= MAX_BANS_PER_POSITION and self.rewinds <= MAX_REWINDS

"""Tokenizing a long text again costs only its new end.

A writer's next request is the text of their last one with a little changed or added at
the end, and llama.cpp's tokenizer reads ~1.5 MB/s here: 0.07 s for a 24,000-token story,
most of a branch's time to first token once the story's KV cells are cached. So the
tokens of recent long texts are kept, and a text that shares a long start with one of them
reuses its tokens up to a word or line start well before the first difference, and
tokenizes only the rest. Tokenizers merge within a word or a few characters, so the split
does not change the tokens (no difference at 400 random word and line starts of a story,
bundled model), and each reuse is checked: the fresh tokens must repeat the kept ones
between the split and the difference, or the whole text is tokenized as usual.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Shorter texts tokenize in well under a millisecond: not worth remembering.
MIN_BYTES = 8192
# The split goes at a word or line start at least this many bytes before the first difference, so
# that the check below compares real tokens on both sides of the split.
MARGIN_BYTES = 256
# How far back from a kept text's end to look for the split (tokens whose bytes are read).
MAX_WALK_TOKENS = 4096
KEPT_TEXTS = 16

Tokenize = Callable[[str, bool], list[int]]  # (text, add_special) -> tokens
Piece = Callable[[int], bytes]


@dataclass(frozen=True)
class _Kept:
    data: npt.NDArray[np.uint8]
    tokens: npt.NDArray[np.int32]


class PrefixTokenizer:
    """Tokenizes texts through `tokenize`, reusing the tokens of a recent text it shares a
    long start with. Thread-safe; one per (add_special, parse_special) setting."""

    def __init__(self, tokenize: Tokenize, piece: Piece, add_special: bool) -> None:
        self._tokenize = tokenize
        self._piece = piece
        self._add_special = add_special
        self._kept: OrderedDict[bytes, _Kept] = OrderedDict()  # most recently used last
        self._lock = threading.Lock()
        self.reused = 0  # texts tokenized from a kept start (for tests and metrics)

    def __call__(self, text: str) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        if len(data) < MIN_BYTES:
            return self._tokenize(text, self._add_special)
        with self._lock:
            kept = list(self._kept.values())
        tokens = self._reuse(data, kept) if kept else None
        if tokens is None:
            tokens = self._tokenize(text, self._add_special)
        else:
            self.reused += 1
        self._keep(data, tokens)
        return tokens

    def _keep(self, data: bytes, tokens: list[int]) -> None:
        entry = _Kept(np.frombuffer(data, np.uint8), np.asarray(tokens, np.int32))
        with self._lock:
            self._kept[data] = entry
            self._kept.move_to_end(data)
            while len(self._kept) > KEPT_TEXTS:
                self._kept.popitem(last=False)

    def _reuse(self, data: bytes, kept: list[_Kept]) -> list[int] | None:
        text = np.frombuffer(data, np.uint8)
        shared, best = max((_common_start(text, k.data), i) for i, k in enumerate(kept))
        if shared < MIN_BYTES:
            return None
        entry = kept[best]
        split = _line_start_before(entry, shared - MARGIN_BYTES, self._piece)
        if split is None:
            return None
        first, starts = split  # entry.tokens[first:] start at `starts`; the first, a word
        fresh = self._tokenize(data[starts[0] :].decode("utf-8", "surrogatepass"), False)
        # The kept tokens well inside the shared bytes must come back unchanged (a token
        # ending at the first difference may rightly merge with what follows it).
        ends = [*starts[1:], len(entry.data)]
        agree = sum(1 for end in ends if end <= shared - MARGIN_BYTES // 4)
        if fresh[:agree] != entry.tokens[first : first + agree].tolist():
            return None
        return entry.tokens[:first].tolist() + fresh


def _common_start(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _line_start_before(entry: _Kept, limit: int, piece: Piece) -> tuple[int, list[int]] | None:
    """Reading the kept tokens back from the text's end: the index of the last one that
    starts a word or a line before byte `limit`, with the byte offsets where it and every later
    token start. None when the tokens' bytes do not spell the text (special tokens,
    normalization) or no such line start lies within MAX_WALK_TOKENS."""
    end, starts = len(entry.data), []
    for i in range(len(entry.tokens) - 1, max(0, len(entry.tokens) - MAX_WALK_TOKENS), -1):
        p = piece(int(entry.tokens[i]))
        begin = end - len(p)
        if not p or begin <= 0 or entry.data[begin:end].tobytes() != p:
            return None
        starts.append(begin)
        if begin < limit and (entry.data[begin] == 0x20 or entry.data[begin - 1] == 0x0A):
            starts.reverse()
            return i, starts
        end = begin
    return None

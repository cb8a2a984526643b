"""Incremental, UTF-8-safe detokenization.

A token's piece can end in the middle of a multi-byte character (emoji, CJK, accented
letters split by byte-fallback tokens). Bytes are buffered and only complete characters
are released; `flush` releases the rest with replacement characters.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class IncrementalDetokenizer:
    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        """Text completed by this token (may be empty while a character is incomplete)."""
        return self._decoder.decode(self._piece(token))

    def state(self) -> object:
        """The bytes of an incomplete character held, for `restore` (a rewind)."""
        return self._decoder.getstate()

    def restore(self, state: object) -> None:
        self._decoder.setstate(state)  # type: ignore[arg-type]

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)

"""Keeps llama.cpp from reusing the cells of cached paths behind a sliding window.

With sliding-window attention (Gemma 3: 512 tokens in most layers), llama.cpp treats a cell
as free when exactly one sequence holds it and it lies a window or more behind that
sequence's last position, even with `swa_full` (llama-kv-cache.cpp, `find_slot`). For one
sequence that is right; for a prefix cache it is not: a later request that forks from
inside that sequence needs the window before the fork point, and would read cells that now
hold other tokens, without any error.

So each sequence `s` gets a twin, `s + twin_offset`, that holds the same cells except the
newest ones, less than half a window: every cell that could be masked is held by two sequences, which
llama.cpp never reuses. Copies and removals are mirrored onto the twins, and after each
decode the twins catch up. Nothing else changes: twins are never decoded and hold no cells
of their own, so the cells in use and their count stay exactly what the engine books.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Copy = Callable[[int, int, int, int], None]  # seq_cp(src, dst, p0, p1)
Remove = Callable[[int, int, int], None]  # seq_rm(seq, p0, p1)


class SwaGuard:
    def __init__(self, copy: Copy, remove: Remove, n_swa: int, twin_offset: int) -> None:
        self._copy = copy
        self._remove = remove
        # A twin leaves its sequence's newest quarter window unheld and catches up once a
        # quarter window more is unheld (a copy every ~128 tokens for Gemma, not every
        # step): the unheld half window is never a window behind, so never reusable.
        self._lag = self._catch_up = max(1, n_swa // 4)
        self.twin_offset = twin_offset
        self._guarded: dict[int, int] = {}  # sequence -> positions [0, n) held by its twin

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self._copy(src, dst, p0, p1)
        self._copy(src, dst + self.twin_offset, p0, p1)
        if p0 <= self._guarded.get(dst, 0):  # contiguous with what the twin holds
            end = p1 if p1 >= 0 else self._guarded.get(src, 0)
            self._guarded[dst] = max(self._guarded.get(dst, 0), end)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self._remove(seq, p0, p1)
        self._remove(seq + self.twin_offset, p0, p1)
        if p0 <= 0 and p1 < 0:
            self._guarded.pop(seq, None)
        elif p0 < self._guarded.get(seq, 0):
            self._guarded[seq] = max(p0, 0)

    def decoded(self, last_positions: Mapping[int, int]) -> None:
        """After a decode: `last_positions` maps each sequence in the batch to its newest
        position. Must run before the next decode (one ubatch per decode: n_ubatch ==
        n_batch, so llama.cpp never reuses cells between parts of one batch)."""
        for seq, last in last_positions.items():
            target = last + 1 - self._lag
            held = self._guarded.get(seq, 0)
            if target - held >= self._catch_up:
                self._copy(seq, seq + self.twin_offset, held, target)
                self._guarded[seq] = target

"""SwaGuard over a model of llama.cpp's cell allocation (`find_slot`: an empty cell, or one
held by a single sequence and a window or more behind that sequence's newest position):
with the guard, writers' workloads never get an occupied cell; without it, they do."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from llama_srb.swa_guard import SwaGuard

N_SWA = 16
TWINS = 100


@dataclass
class Cells:
    """llama.cpp's unified KV cache, as far as allocation goes."""

    size: int
    pos: list[int] = field(default_factory=list)
    seqs: list[set[int]] = field(default_factory=list)
    overwritten: int = 0  # cells taken from a sequence that still held them

    def __post_init__(self) -> None:
        self.pos = [-1] * self.size
        self.seqs = [set() for _ in range(self.size)]

    def pos_max(self, seq: int) -> int:
        return max((p for p, s in zip(self.pos, self.seqs, strict=True) if seq in s), default=-1)

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        for i in range(self.size):
            if src in self.seqs[i] and p0 <= self.pos[i] and (p1 < 0 or self.pos[i] < p1):
                self.seqs[i].add(dst)

    def remove(self, seq: int, p0: int, p1: int) -> None:
        for i in range(self.size):
            if seq in self.seqs[i] and p0 <= self.pos[i] and (p1 < 0 or self.pos[i] < p1):
                self.seqs[i].discard(seq)

    def decode(self, tokens: list[tuple[int, int]]) -> None:
        """(sequence, position) per token; cells chosen as find_slot does, from cell 0."""
        free = []
        for i in range(self.size):
            held = self.seqs[i]
            masked = len(held) == 1 and self.pos_max(next(iter(held))) + 1 - self.pos[i] >= N_SWA
            if not held or masked:
                free.append(i)
        assert len(free) >= len(tokens), "the workload outgrew the cache"
        for (seq, pos), i in zip(tokens, free, strict=False):
            self.overwritten += bool(self.seqs[i])
            self.pos[i], self.seqs[i] = pos, {seq}


def writers(cells: Cells, guarded: bool, seed: int) -> None:
    """Stories grow in prefill chunks and decode steps, branches fork from them (from the
    end and from deep inside), finished branches stay cached, old ones are evicted."""
    guard = SwaGuard(cells.copy, cells.remove, N_SWA, TWINS)
    copy, remove = (guard.seq_cp, guard.seq_rm) if guarded else (cells.copy, cells.remove)
    rng = random.Random(seed)
    length: dict[int, int] = {}
    for _ in range(150):
        live = [s for s in length if length[s] < 120 and rng.random() < 0.5]
        if not live or rng.random() < 0.1:
            free_ids = [s for s in range(20) if s not in length]
            if not free_ids or len(length) > 6:
                victim = min(length)
                remove(victim, 0, -1)
                del length[victim]
                continue
            new = free_ids[0]
            if length and rng.random() < 0.7:  # fork from a cached path
                src = rng.choice(list(length))
                at = rng.randrange(1, length[src] + 1)
                copy(src, new, 0, at)
                length[new] = at
            else:
                length[new] = 0
            live = [new]
        tokens = []
        for seq in live:
            grow = rng.choice([1, 1, 1, 8, 24])
            tokens += [(seq, length[seq] + k) for k in range(grow)]
            length[seq] += grow
        cells.decode(tokens)
        if guarded:
            guard.decoded({seq: length[seq] - 1 for seq in live})


@pytest.mark.parametrize("seed", range(5))
def test_no_cell_a_sequence_still_holds_is_ever_reused(seed: int) -> None:
    cells = Cells(size=1500)
    writers(cells, guarded=True, seed=seed)
    assert cells.overwritten == 0


def test_without_the_guard_cells_of_cached_paths_are_reused() -> None:
    cells = Cells(size=1500)
    writers(cells, guarded=False, seed=0)
    assert cells.overwritten > 0


def test_twins_follow_removals_and_free_every_cell() -> None:
    cells = Cells(size=200)
    guard = SwaGuard(cells.copy, cells.remove, N_SWA, TWINS)
    cells.decode([(0, p) for p in range(60)])
    guard.decoded({0: 59})
    guard.seq_cp(0, 1, 0, 40)
    guard.seq_rm(0, 0, -1)
    guard.seq_rm(1, 0, -1)
    assert not any(cells.seqs)

"""KV bookkeeping: sequence ids, KV cells promised to live requests, and the prefix cache.

Pure accounting with paired check/commit calls (`can_admit` / `admit`), tested without a
model. Methods that change what llama.cpp holds return `KvOp`s; the engine applies them.

The unified KV cache stores a cell once however many sequences share it: `seq_cp` only
tags existing cells with another sequence id. So a finished branch can stay behind as a
*cached path* (its own seq id, its cells untouched) from which a later prompt that starts
with the same tokens forks for free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from llama_srb.engine.sequence import Request


@dataclass(frozen=True)
class KvOp:
    """A change to the native KV cache: copy cells [p0, p1) of `src` to `dst`, or remove
    cells [p0, p1) from `dst` (src < 0). p1 < 0 means "to the end"."""

    src: int
    dst: int
    p0: int = 0
    p1: int = -1

    @staticmethod
    def remove(seq_id: int, p0: int = 0, p1: int = -1) -> KvOp:
        return KvOp(-1, seq_id, p0, p1)

    @property
    def is_remove(self) -> bool:
        return self.src < 0


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix; slice compares run in C."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi + 1] != b[:hi + 1]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)
class CachedPath:
    """A token path whose KV cells (positions 0..len-1) a parked seq id keeps alive."""

    seq_id: int
    tokens: list[int]
    last_used: int
    pins: int = 0  # live requests that forked from it and counted on its cells


@dataclass
class PrefixCache:
    """Cached token paths with LRU eviction, bounded in cells (`max_cells`; 0 disables it).

    Invariant: any two paths share their KV cells over their whole common token prefix
    (a new path is re-pointed at the cells of its best match when it is parked). So the
    cells held by the cache are the distinct prefixes of its paths, computed exactly.
    """

    max_cells: int
    paths: list[CachedPath] = field(default_factory=list)
    _clock: itertools.count[int] = field(default_factory=itertools.count)
    _all_cells: int | None = None  # cells() of all paths, until the paths change

    @property
    def enabled(self) -> bool:
        return self.max_cells > 0

    def cells(self, paths: list[CachedPath] | None = None) -> int:
        """Distinct cells of `paths` (default: all, memoized: admission asks every step
        while a request waits): sum of lengths minus sum of LCPs of sorted neighbours."""
        if paths is None and self._all_cells is not None:
            return self._all_cells
        ordered = sorted(p.tokens for p in (self.paths if paths is None else paths))
        shared = sum(common_prefix(a, b) for a, b in itertools.pairwise(ordered))
        total = sum(len(t) for t in ordered) - shared
        if paths is None:
            self._all_cells = total
        return total

    def pinned_cells(self, extra: CachedPath | None = None) -> int:
        pinned = [p for p in self.paths if p.pins or p is extra]
        return self.cells(pinned)

    def longest(self, tokens: list[int]) -> tuple[CachedPath | None, int]:
        best, best_len = None, 0
        for path in self.paths:
            n = common_prefix(tokens, path.tokens)
            if n > best_len:
                best, best_len = path, n
        return best, best_len

    def touch(self, path: CachedPath) -> None:
        path.last_used = next(self._clock)

    def park(self, seq_id: int, tokens: list[int]) -> tuple[list[KvOp], list[int]]:
        """Keep a finished sequence's cells as a cached path (its id now belongs to the
        cache). Returns the ops that re-point its shared prefix at existing cells, and the
        ids of paths it made redundant (their cells are removed by the ops)."""
        best, shared = self.longest(tokens)
        if best is not None and shared == len(tokens):  # nothing new: keep the old path
            self.touch(best)
            return [KvOp.remove(seq_id)], [seq_id]
        ops: list[KvOp] = []
        if best is not None and shared > 0:
            # Same tokens, maybe different cells (computed separately): share the best's.
            ops += [KvOp.remove(seq_id, 0, shared), KvOp(best.seq_id, seq_id, 0, shared)]
        dropped = [
            p for p in self.paths if not p.pins and common_prefix(p.tokens, tokens) == len(p.tokens)
        ]
        for path in dropped:  # a prefix of the new path: fully covered by it
            ops.append(KvOp.remove(path.seq_id))
            self.paths.remove(path)
        self.paths.append(CachedPath(seq_id, tokens, next(self._clock)))
        self._all_cells = None
        return ops, [p.seq_id for p in dropped]

    def evict_lru(self) -> int | None:
        """Drop the least recently used unpinned path; returns its seq id to clear."""
        candidates = [p for p in self.paths if not p.pins]
        if not candidates:
            return None
        victim = min(candidates, key=lambda p: p.last_used)
        self.paths.remove(victim)
        self._all_cells = None
        return victim.seq_id


class KvBudget:
    """Sequence ids and KV cells, shared by live requests and the prefix cache.

    A request reserves the prompt cells it must compute (its prompt minus the prefix it
    forks from a cached path, which stays pinned while it runs) plus `max_tokens` cells
    per branch. A finished branch returns its reservation and, with the cache on, parks
    its cells as a cached path. A running request always wins: admission evicts cached
    paths (least recently used first) until it fits.
    """

    def __init__(self, max_live: int, n_cells: int, cache_paths: int = 0, cache_cells: int = 0):
        self.max_live = max_live
        self.n_seq = max_live + (cache_paths if cache_cells > 0 else 0)
        self.n_cells = n_cells
        self.cache = PrefixCache(min(cache_cells, n_cells))
        self._free_ids = list(range(self.n_seq - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.live = 0  # live sequences
        self.cells_reserved = 0

    @property
    def free_ids(self) -> int:
        return len(self._free_ids)

    @property
    def cells_used(self) -> int:
        return self.cells_reserved + self.cache.cells()

    def fits_ever(self, request: Request) -> bool:
        return request.n <= self.max_live and request.cells_needed <= self.n_cells

    def match(self, request: Request) -> tuple[CachedPath | None, int]:
        """The cached path to fork from and how many prompt tokens it provides (at most
        all but the last: that one is decoded again to give the first logits)."""
        if not self.cache.enabled or request.prompt_logprobs:  # echo+logprobs: score it all
            return None, 0
        path, shared = self.cache.longest(request.prompt)
        return path, min(shared, request.prompt_len - 1)

    def can_admit(self, request: Request) -> bool:
        source, shared = self.match(request)
        return (
            self.live + request.n <= self.max_live
            and request.n <= self.free_ids + sum(1 for p in self.cache.paths if not p.pins)
            and self.cells_reserved
            + request.cells_needed
            - shared
            + self.cache.pinned_cells(source)
            <= self.n_cells
        )

    def admit(self, request: Request) -> list[KvOp]:
        """Reserve ids and cells, fork from the best cached path; returns the native ops."""
        assert self.can_admit(request)
        source, shared = self.match(request)
        ops: list[KvOp] = []
        if source is not None and shared > 0:
            source.pins += 1
            self.cache.touch(source)
            request.cache_source = source
        else:
            shared = 0
        need = request.cells_needed - shared
        while (
            self.free_ids < request.n
            or self.cells_reserved + need + self.cache.cells() > self.n_cells
        ):
            victim = self.cache.evict_lru()
            if victim is None:
                break
            ops.append(KvOp.remove(victim))
            self._free_ids.append(victim)
        for seq in request.sequences:
            seq.seq_id = self._free_ids.pop()
        self.live += request.n
        self.cells_reserved += need
        request.cells_reserved_prompt = request.prompt_len - shared
        if shared:
            ops.append(KvOp(source.seq_id, request.primary.seq_id, 0, shared))  # type: ignore[union-attr]
            request.n_prefilled = request.n_cached = shared
        return ops

    def release_sequence(self, request: Request, seq_id: int, path: list[int] | None) -> list[KvOp]:
        """A branch ended. With `path` (the tokens its cells hold) and the cache on, its
        cells are parked as a cached path; otherwise they are removed."""
        self.live -= 1
        self.cells_reserved -= request.params.max_tokens
        if path and self.cache.enabled:
            ops, freed = self.cache.park(seq_id, path)
            self._free_ids.extend(freed)
            return ops + self._shrink_cache()
        self._free_ids.append(seq_id)
        return [KvOp.remove(seq_id)]

    def release_prompt(self, request: Request) -> list[KvOp]:
        self.cells_reserved -= request.cells_reserved_prompt
        if request.cache_source is not None:
            request.cache_source.pins -= 1
            request.cache_source = None
        return self._shrink_cache()

    def _shrink_cache(self) -> list[KvOp]:
        ops = []
        while self.cache.paths and (
            self.cache.cells() > self.cache.max_cells or self.cells_used > self.n_cells
        ):
            victim = self.cache.evict_lru()
            if victim is None:
                break
            ops.append(KvOp.remove(victim))
            self._free_ids.append(victim)
        return ops

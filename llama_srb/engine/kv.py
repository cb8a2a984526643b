"""KV bookkeeping: sequence ids, KV cells promised to live requests, and the prefix cache.

Accounting with paired check/commit calls (`can_admit` / `admit`), tested without a
model. Methods that change what llama.cpp holds return `KvOp`s; the engine applies them.
Nothing here writes to a request: `admit` returns a Grant (the sequence ids, the prompt
tokens forked from the cache), which the scheduler records. What a running request
reserved is recorded here, not on the request.

The unified KV cache stores a cell once however many sequences share it: `seq_cp` only
tags existing cells with another sequence id. So a finished branch can stay behind as a
*cached path* (its own sequence id, its cells untouched) from which a later prompt that
starts with the same tokens forks for free.

The policy (its numbers are in docs/benchmarks.md, "Prefix cache"):
- Every cell that running requests do not need may hold cached paths: an idle cell costs
  a decode step far less than re-reading a story costs. A running request always wins:
  admission evicts the least recently used paths until it fits.
- A request forks from the cache only when the shared prefix is worth it
  (`MIN_SHARED_TOKENS`): a match on the BOS token alone would pin a long path for nothing.
- A request's finished branches keep their cells (and the room they filled; the rest is
  freed at once) until the whole request ends; then they are parked together. So the
  counts stay exact, and parking never evicts what it parks.
- With lower tiers (engine/tiers.py), an evicted path is saved there first (`KvSave`), and
  a prompt whose longest cached prefix sits there gets it back (`KvRestore`) into its own
  first sequence: those cells are the request's own, reserved like computed ones, so a
  restore that fails costs only the reading it saved.
- Sliding-window models: cells restored from a tier hold only the last window of those
  layers, so forks from inside them would not be exact. A path (or request) holding such
  cells has a `floor`: forks from it share at least that many tokens. Paths that would
  share cells below a floor are kept apart by evicting one (to the tiers).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from llama_srb.engine.request import Request
from llama_srb.engine.tiers import TierEntry, TierStore

# Shorter shared prefixes are computed again rather than forked: they save a few ms of
# prefill, and forking would pin the whole cached path for as long as the request runs.
MIN_SHARED_TOKENS = 32

Tokens = npt.NDArray[np.int32]


def as_tokens(tokens: Sequence[int]) -> Tokens:
    return np.asarray(tokens, dtype=np.int32)


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


@dataclass(frozen=True, eq=False)
class KvSave(KvOp):
    """Copy the cells of cached path `dst` (its `tokens`) down to the tiers. `prompt_end`:
    the end of the prompt that left it (0: none), for a second entry that ends there (with
    a sliding window an entry is exact only at its end: this one makes a swipe, the same
    prompt again, a hit). The sequence may be cut to it: the op is followed by its removal."""

    tokens: Tokens = field(default_factory=lambda: as_tokens([]))
    prompt_end: int = 0


@dataclass(frozen=True, eq=False)
class KvRestore(KvOp):
    """Load a tier `entry` into the empty sequence `dst`, keeping its first `p1` cells."""

    entry: TierEntry | None = None


def common_prefix(a: Sequence[int] | Tokens, b: Sequence[int] | Tokens) -> int:
    """Length of the longest common prefix. Token arrays compare in one numpy pass; lists
    by a binary search over slice compares (both run in C)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        m = min(len(a), len(b))
        mismatches = np.flatnonzero(a[:m] != b[:m])
        return int(mismatches[0]) if mismatches.size else m
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


class Shortage(enum.Enum):
    """What a request that cannot be admitted lacks."""

    SEQUENCES = "sequences"  # the server's sequence ids, or its client's share of them
    CELLS = "cells"


@dataclass(frozen=True)
class Grant:
    """What admitting a request gave it: a sequence id per branch, in order, and the
    prompt tokens forked from a cached path into its first branch (by `ops`)."""

    seq_ids: tuple[int, ...]
    forked: int
    ops: tuple[KvOp, ...]


@dataclass(frozen=True)
class Match:
    """Where a prompt's cached prefix comes from: `shared` tokens forked from a live path
    (`source`), or restored from a tier `entry`, or none (both None)."""

    source: CachedPath | None = None
    shared: int = 0
    entry: TierEntry | None = None


NO_MATCH = Match()


@dataclass(eq=False)
class CachedPath:
    """A token path whose KV cells (positions 0..len-1) a parked branch id keeps alive."""

    seq_id: int
    tokens: Tokens
    last_used: int
    pins: int = 0  # live requests that forked from it and counted on its cells
    floor: int = 0  # forks from it share at least this many tokens (sliding-window layers)
    prompt_len: int = 0  # the prompt of the request that left it (where swipes fork)
    # Common prefix length with every other cached path, by branch id: computed once, at park.
    shared: dict[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def own_cells(self) -> int:
        """Cells no other cached path shares: what evicting this path frees."""
        return len(self) - max(self.shared.values(), default=0)


@dataclass
class Reservation:
    """What a running request holds beyond its live branches' branch ids."""

    prompt_cells: int  # prompt cells this request computes itself
    source: CachedPath | None = None  # the cached path it forked from, pinned until it ends
    floor: int = 0  # forks from its cells share at least this many tokens
    restored: TierEntry | None = None  # the tier entry its first sequence was loaded from
    # Finished branches, (branch id, tokens its cells hold): parked when the request ends, so
    # that its reservation still counts their cells until then.
    finished: list[tuple[int, list[int]]] = field(default_factory=list)


@dataclass
class PrefixCache:
    """Cached token paths with LRU eviction. `max_idle_cells` bounds the cells that only
    unpinned paths hold (0 disables the cache); the budget bounds all of them.

    Invariant: any two paths share their KV cells over their whole common token prefix
    (a new path is re-pointed at the cells of its best match when it is parked). So the
    cells held by a set of paths are the distinct prefixes of their tokens (the size of
    their trie), counted exactly from the pairwise common prefixes.
    """

    max_idle_cells: int
    save_evicted: bool = False  # copy evicted paths down to the tiers first
    paths: list[CachedPath] = field(default_factory=list)
    generation: int = 0  # changes whenever the set of paths does (a key for memoized matches)
    _clock: itertools.count[int] = field(default_factory=itertools.count)
    _cells: int = 0  # distinct cells of all paths, kept up to date as paths come and go

    @property
    def enabled(self) -> bool:
        return self.max_idle_cells > 0

    def cells(self) -> int:
        return self._cells

    @staticmethod
    def cells_of(paths: Sequence[CachedPath]) -> int:
        """Distinct cells of `paths`: each adds what it does not share with those before."""
        total = 0
        for i, path in enumerate(paths):
            total += len(path) - max((path.shared[p.seq_id] for p in paths[:i]), default=0)
        return total

    def pinned_cells(self, extra: CachedPath | None = None) -> int:
        """Cells that running requests count on (and `extra`'s, about to be pinned)."""
        return self.cells_of([p for p in self.paths if p.pins or p is extra])

    def idle_cells(self) -> int:
        """Cells that only unpinned paths hold: what evicting all of them would free."""
        return self._cells - self.pinned_cells()

    def longest(self, tokens: Tokens, limit: int | None = None) -> tuple[CachedPath | None, int]:
        """The path sharing the longest prefix with `tokens` (at most `limit` of them) that
        may be forked that far; of equal ones, the shortest (pinning it holds the fewest
        cells)."""
        best, best_len = None, 0
        for path in self.paths:
            n = common_prefix(tokens, path.tokens)
            n = n if limit is None else min(n, limit)
            if n < path.floor:
                continue
            if n > best_len or (n == best_len and best is not None and len(path) < len(best)):
                best, best_len = path, n
        return best, best_len

    def touch(self, path: CachedPath) -> None:
        path.last_used = next(self._clock)

    def park(
        self, seq_id: int, tokens: Sequence[int], floor: int = 0, prompt_len: int = 0
    ) -> tuple[list[KvOp], list[int]]:
        """Keep a finished sequence's cells as a cached path (its id now belongs to the
        cache; `floor`, `prompt_len`: see CachedPath). Returns the ops that re-point its
        shared prefix at existing cells, and the ids of paths it made redundant or that
        had to make way (their cells are removed by the ops)."""
        array = as_tokens(tokens)
        shared = {p.seq_id: common_prefix(array, p.tokens) for p in self.paths}
        # Its prefix may share the cells of a path it extends past that one's floor only.
        sources = [p for p in self.paths if shared[p.seq_id] >= p.floor]
        best = max(sources, key=lambda p: shared[p.seq_id], default=None)
        best_len = shared[best.seq_id] if best is not None else 0
        if best is not None and best_len == len(array):
            self.touch(best)  # nothing new: keep the old path
            return [KvOp.remove(seq_id)], [seq_id]
        # Paths whose common prefix with it could not share cells (a floor between them)
        # break the count of cells; one side makes way.
        apart = [p for p in self.paths if shared[p.seq_id] > self._via(best, best_len, p)]
        # It could never stay (do not evict others for it), or those stay: it goes down.
        if len(array) > self.max_idle_cells or any(p.pins for p in apart):
            path = CachedPath(seq_id, array, 0, floor=floor, prompt_len=prompt_len, shared=shared)
            return [*self._saved(path), KvOp.remove(seq_id)], [seq_id]
        ops: list[KvOp] = []
        for path in apart:
            ops += self._evict(path)
            del shared[path.seq_id]
        if best is not None and best_len > 0:
            # Same tokens, maybe different cells (computed separately): share the best's.
            ops += [KvOp.remove(seq_id, 0, best_len), KvOp(best.seq_id, seq_id, 0, best_len)]
            if best_len >= floor:  # its restored cells are replaced by the best's
                floor = best.floor
        covered = [p for p in self.paths if not p.pins and shared[p.seq_id] == len(p)]
        for path in covered:  # a prefix of the new path: fully covered by it
            ops.append(KvOp.remove(path.seq_id))
            self._remove(path)
            del shared[path.seq_id]
        self._add(CachedPath(seq_id, array, next(self._clock), 0, floor, prompt_len, shared))
        return ops, [p.seq_id for p in apart + covered]

    @staticmethod
    def _via(best: CachedPath | None, best_len: int, path: CachedPath) -> int:
        """The cells a new path re-pointed at `best`'s first `best_len` shares with `path`."""
        if best is None:
            return 0
        return best_len if path is best else min(best_len, best.shared[path.seq_id])

    def evict_lru(self) -> tuple[int, list[KvOp]] | None:
        """Drop the least recently used unpinned path (saved down first, with tiers): its
        branch id and the ops that clear it, or None when every path is pinned."""
        candidates = [p for p in self.paths if not p.pins]
        if not candidates:
            return None
        victim = min(candidates, key=lambda p: p.last_used)
        return victim.seq_id, self._evict(victim)

    def _evict(self, path: CachedPath) -> list[KvOp]:
        save = self._saved(path)
        self._remove(path)
        return [*save, KvOp.remove(path.seq_id)]

    def _saved(self, path: CachedPath) -> list[KvOp]:
        return [self.save_op(path)] if self.save_evicted else []

    @staticmethod
    def save_op(path: CachedPath) -> KvSave:
        """The op that copies a path down (with its prompt's end, where that is exact)."""
        end = path.prompt_len
        if not (max(path.floor, MIN_SHARED_TOKENS) <= end < len(path) - 1):
            end = 0  # no prompt end whose cells are exact and worth an entry of its own
        return KvSave(path.seq_id, path.seq_id, tokens=path.tokens, prompt_end=end)

    def _add(self, path: CachedPath) -> None:
        for other in self.paths:
            other.shared[path.seq_id] = path.shared[other.seq_id]
        self._cells += path.own_cells
        self.paths.append(path)
        self.generation += 1

    def _remove(self, path: CachedPath) -> None:
        self._cells -= path.own_cells
        self.paths.remove(path)
        for other in self.paths:
            del other.shared[path.seq_id]
        self.generation += 1


class KvBudget:
    """Sequence ids and KV cells, shared by live requests and the prefix cache.

    A request reserves the prompt cells it must compute (its prompt minus the prefix it
    forks from a cached path, which stays pinned while it runs) plus `max_tokens` cells
    per branch, until it ends. Then, with the cache on, its branches' cells are parked as
    cached paths. A running request always wins: admission evicts cached paths (least
    recently used first) until it fits.
    """

    def __init__(
        self,
        max_live: int,
        n_cells: int,
        cache_paths: int = 0,
        cache_cells: int = 0,
        tiers: TierStore | None = None,
    ):
        """`tiers`: where evicted paths go and restores come from (None: dropped)."""
        self.max_live = max_live
        self.n_seq = max_live + (cache_paths if cache_cells > 0 else 0)
        self.n_cells = n_cells
        self.tiers = tiers if tiers is not None and tiers.enabled and cache_cells > 0 else None
        self.cache = PrefixCache(min(cache_cells, n_cells), save_evicted=self.tiers is not None)
        self._free_ids = list(range(self.n_seq - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.live = 0  # live sequences
        self.cells_reserved = 0
        self._running: dict[Request, Reservation] = {}
        # Per waiting request, its match as of one generation of the cache and the tiers.
        self._matches: dict[Request, Match] = {}
        self._matches_of = (-1, -1)  # the generations they are of

    @property
    def free_ids(self) -> int:
        return len(self._free_ids)

    @property
    def cells_used(self) -> int:
        return self.cells_reserved + self.cache.cells()

    def fits_ever(self, request: Request) -> bool:
        return request.n_branches <= self.max_live and request.cells_needed <= self.n_cells

    def match(self, request: Request) -> Match:
        """Where the prompt's cached prefix comes from and how many tokens it provides (at
        most all but the last: that one is decoded again to give the first logits): a live
        path, or a tier when that saves at least MIN_SHARED_TOKENS more. Memoized per
        request until the cache or the tiers change: admission asks every step while
        requests wait."""
        if not self.cache.enabled or request.prompt_logprobs:  # echo+logprobs: score it all
            return NO_MATCH
        generations = (self.cache.generation, self.tiers.generation if self.tiers else 0)
        if self._matches_of != generations:
            self._matches, self._matches_of = {}, generations
        memo = self._matches.get(request)
        if memo is not None:
            return memo
        tokens, limit = as_tokens(request.prompt), request.prompt_len - 1
        path, shared = self.cache.longest(tokens, limit)
        found = NO_MATCH
        # Not a path pinned beside the request it could never fit: computed instead.
        if (
            path is not None
            and shared >= MIN_SHARED_TOKENS
            and request.cells_needed - shared + len(path) <= self.n_cells
        ):
            found = Match(path, shared)
        if self.tiers is not None:
            entry, restored = self.tiers.best(tokens, limit, self.n_cells)
            # One restore of an entry at a time: a request loading it already is forked
            # from by the scheduler once its cells are there.
            loading = any(r.restored is entry for r in self._running.values())
            if entry is not None and not loading and restored - found.shared >= MIN_SHARED_TOKENS:
                found = Match(None, restored, entry)
        self._matches[request] = found
        return found

    def cells_to_reserve(self, request: Request) -> int:
        """The cells admitting the request now would reserve: all but what it forks; a
        restore loads a whole entry before it is cut to the shared prefix."""
        found = self.match(request)
        if found.entry is not None:
            return max(request.cells_needed, len(found.entry))
        return request.cells_needed - found.shared

    def can_admit(self, request: Request) -> bool:
        source = self.match(request).source
        evictable = sum(1 for p in self.cache.paths if not p.pins and p is not source)
        return (
            self.live + request.n_branches <= self.max_live
            and request.n_branches <= self.free_ids + evictable
            and self.cells_reserved
            + self.cells_to_reserve(request)
            + self.cache.pinned_cells(source)
            <= self.n_cells
        )

    def fork_floor(self, request: Request) -> int:
        """Forks from a running request's cells share at least this many tokens."""
        reservation = self._running.get(request)
        return reservation.floor if reservation is not None else 0

    def restore_failed(self, request: Request) -> None:
        """llama.cpp refused a tier's bytes: the request reads its whole prompt."""
        reservation = self._running[request]
        reservation.floor, reservation.restored = 0, None

    def shortage(self, request: Request) -> Shortage:
        """What keeps a request that `can_admit` refuses waiting."""
        if self.live + request.n_branches > self.max_live:
            return Shortage.SEQUENCES
        return Shortage.CELLS

    def admit(self, request: Request) -> Grant:
        """Reserve ids and cells, fork from the best cached path."""
        assert self.can_admit(request)
        found = self.match(request)
        source, entry = found.source, found.entry
        if source is not None:
            source.pins += 1
            self.cache.touch(source)
        need = self.cells_to_reserve(request)
        floor = source.floor if source is not None else entry.floor if entry is not None else 0
        self._running[request] = Reservation(
            request.prompt_len - (request.cells_needed - need), source, floor, restored=entry
        )
        if entry is not None:
            self._matches_of = (-1, -1)  # others waiting for this entry now fork from here
        ops = self._evict_until(
            lambda: (
                self.free_ids >= request.n_branches
                and self.cells_reserved + need + self.cache.cells() <= self.n_cells
            )
        )
        seq_ids = tuple(self._free_ids.pop() for _ in request.branches)
        self.live += request.n_branches
        self.cells_reserved += need
        if source is not None:
            ops.append(KvOp(source.seq_id, seq_ids[0], 0, found.shared))
        elif entry is not None:
            ops.append(KvRestore(-1, seq_ids[0], 0, found.shared, entry=entry))
        return Grant(seq_ids, found.shared, tuple(ops))

    def add_sequence(self, request: Request) -> tuple[int, list[KvOp]] | None:
        """A branch for a running request in place of one about to end (live branching's
        refill): a sequence id and its cells, `max_tokens` + 1 (its prompt's last token is
        decoded again in its own sequence). None when they do not fit now; cached paths
        make way if they must. Live sequences count one over until the other ends."""
        need = request.params.max_tokens + 1
        evictable = sum(1 for p in self.cache.paths if not p.pins)
        if (
            self.live > self.max_live
            or self.free_ids + evictable < 1
            or self.cells_reserved + need + self.cache.pinned_cells() > self.n_cells
        ):
            return None
        ops = self._evict_until(
            lambda: (
                self.free_ids >= 1
                and self.cells_reserved + need + self.cache.cells() <= self.n_cells
            )
        )
        self.live += 1
        self.cells_reserved += need
        self._running[request].prompt_cells += 1  # the extra cell, returned with the prompt's
        return self._free_ids.pop(), ops

    def kept_paths(self, request: Request) -> list[tuple[int, list[int]]]:
        """The ended branches of a running request whose cells stay until it ends, as
        (sequence id, the tokens its cells hold): a live prefix others may fork from."""
        reservation = self._running.get(request)
        return reservation.finished if reservation is not None else []

    def release_sequence(self, request: Request, seq_id: int, path: list[int] | None) -> list[KvOp]:
        """A branch ended. With `path` (the tokens its cells hold) and the cache on, its
        cells stay until the request ends, to be parked then, and the room it did not use
        is free now (for a fork, a refill, another request); otherwise all of it goes now."""
        self.live -= 1
        if path and self.cache.enabled:
            self.cells_reserved -= request.params.max_tokens - _generated(request, path)
            self._running[request].finished.append((seq_id, path))
            return []
        self.cells_reserved -= request.params.max_tokens
        self._free_ids.append(seq_id)
        return [KvOp.remove(seq_id)]

    def release_request(self, request: Request) -> list[KvOp]:
        """The request ended (every branch released): return its cells, park its branches."""
        reservation = self._running.pop(request)
        if reservation.source is not None:  # first: a source the new paths cover may go
            reservation.source.pins -= 1
        self.cells_reserved -= reservation.prompt_cells
        self.cells_reserved -= sum(_generated(request, path) for _, path in reservation.finished)
        ops: list[KvOp] = []
        for seq_id, path in reservation.finished:
            park_ops, freed = self.cache.park(seq_id, path, reservation.floor, request.prompt_len)
            ops += park_ops
            self._free_ids.extend(freed)
        return ops + self._evict_until(
            lambda: (
                self.cache.idle_cells() <= self.cache.max_idle_cells
                and self.cells_used <= self.n_cells
            )
        )

    def _evict_until(self, enough: Callable[[], bool]) -> list[KvOp]:
        """Evict least recently used unpinned paths until `enough()` (or none is left)."""
        ops: list[KvOp] = []
        while not enough():
            evicted = self.cache.evict_lru()
            if evicted is None:
                break
            ops += evicted[1]
            self._free_ids.append(evicted[0])
        return ops


def _generated(request: Request, path: list[int]) -> int:
    """The cells of an ended branch's path past its prompt: what it kept of its room."""
    return max(0, len(path) - request.prompt_len)

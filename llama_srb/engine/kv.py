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
- Where a prompt forks from (a cached path, a tier entry, a running request's
  sequence) is the prefix index's answer (engine/prefix_index.py): one lookup, one set of
  rules (`MIN_SHARED_TOKENS`: a match on the BOS token alone would pin a long path for
  nothing). A request reserves only the cells it adds: cells forked from a running
  request are its lender's to count, so the lender's cells stay until its borrowers end.
- A request's finished branches keep their cells (and the room they filled; the rest is
  freed at once) until the whole request ends (and nothing running borrows its cells);
  then they are parked together. So the counts stay exact, and parking never evicts what
  it parks.
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

from llama_srb.engine.prefix_index import (
    MIN_SHARED_TOKENS,
    NO_SOURCE,
    CachedPath,
    PrefixIndex,
    Reservation,
    Source,
    Tokens,
    as_tokens,
    common_prefix,
)
from llama_srb.engine.request import Request, RequestStatus
from llama_srb.engine.tiers import TierEntry, TierStore

__all__ = ["MIN_SHARED_TOKENS", "NO_SOURCE", "Source", "as_tokens", "common_prefix"]


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


class Shortage(enum.Enum):
    """What a request that cannot be admitted lacks."""

    SEQUENCES = "sequences"  # the server's sequence ids, or its client's share of them
    CELLS = "cells"


@dataclass(frozen=True)
class Grant:
    """What admitting a request gave it: a sequence id per branch, in order, and the
    prompt tokens forked into its first branch (by `ops`) from `source`."""

    seq_ids: tuple[int, ...]
    forked: int
    ops: tuple[KvOp, ...]
    source: Source = NO_SOURCE


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

    def touch(self, path: CachedPath) -> None:
        path.last_used = next(self._clock)

    def park(
        self,
        seq_id: int,
        tokens: Sequence[int],
        floor: int = 0,
        prompt_len: int = 0,
        cells_on: int | None = None,
    ) -> tuple[list[KvOp], list[int]]:
        """Keep a finished sequence's cells as a cached path (its id now belongs to the
        cache; `floor`, `prompt_len`: see CachedPath). `cells_on`: the sequence that holds
        them now, when not `seq_id` (then empty): they move to `seq_id`, all but the prefix
        the re-pointing below gives it, and `cells_on` is emptied. Returns the ops that
        re-point its shared prefix at existing cells, and the ids of paths it made redundant
        or that had to make way (their cells are removed by the ops); `seq_id` among them
        when the path is not kept."""
        on = seq_id if cells_on is None else cells_on
        array = as_tokens(tokens)
        shared = self._common_prefixes(array)
        # Its prefix may share the cells of a path it extends past that one's floor only:
        # the best source is the first that shares the most; and the paths it covers.
        best: CachedPath | None = None
        best_len = 0
        below_floor: list[CachedPath] = []
        covered: list[CachedPath] = []
        for p in self.paths:
            n = shared[p.seq_id]
            if n < p.floor:
                below_floor.append(p)
            elif n > best_len or best is None:
                best, best_len = p, n
            if n == len(p.tokens) and not p.pins:
                covered.append(p)
        if best is not None and best_len == len(array):
            self.touch(best)  # nothing new: keep the old path
            return [KvOp.remove(on)], [seq_id]
        # Paths whose common prefix with it could not share cells (a floor between them)
        # break the count of cells; one side makes way. (A source never does: it shares
        # with the best at least what it shares with the new path.)
        apart = [p for p in below_floor if shared[p.seq_id] > self._via(best, best_len, p)]
        # It could never stay (do not evict others for it), or those stay: it goes down.
        if len(array) > self.max_idle_cells or any(p.pins for p in apart):
            path = CachedPath(on, array, 0, floor=floor, prompt_len=prompt_len, shared=shared)
            return [*self._saved(path), KvOp.remove(on)], [seq_id]
        ops: list[KvOp] = []
        for path in apart:
            ops += self._evict(path)
            del shared[path.seq_id]
        moved = on != seq_id
        if moved:  # its cells go over, but for the prefix the best's give it below
            ops.append(KvOp(on, seq_id, best_len))
        if best is not None and best_len > 0:
            # Same tokens, maybe different cells (computed separately): share the best's.
            if not moved:
                ops.append(KvOp.remove(seq_id, 0, best_len))
            ops.append(KvOp(best.seq_id, seq_id, 0, best_len))
            if best_len >= floor:  # its restored cells are replaced by the best's
                floor = best.floor
        if moved:
            ops.append(KvOp.remove(on))
        covered = [p for p in covered if p not in apart]
        for path in covered:  # a prefix of the new path: fully covered by it
            ops.append(KvOp.remove(path.seq_id))
            self._remove(path)
            del shared[path.seq_id]
        self._add(CachedPath(seq_id, array, next(self._clock), 0, floor, prompt_len, shared))
        return ops, [p.seq_id for p in apart + covered]

    def _common_prefixes(self, array: Tokens) -> dict[int, int]:
        """The common prefix of `array` with every cached path, by branch id. Compared with
        the newest path, then only where that leaves it open: a path that shares s tokens
        with the newest, which shares n with `array`, shares min(s, n) with it unless s == n
        (a branch parked beside its siblings: all share the prompt, and most part at the
        next token)."""
        if not self.paths:
            return {}
        newest = self.paths[-1]
        n = common_prefix(array, newest.tokens)
        after = int(array[n]) if n < len(array) else -1  # its token after those n
        by_newest = newest.shared  # every other path's common prefix with the newest
        shared = {seq_id: s if s < n else n for seq_id, s in by_newest.items()}
        # those that share exactly n with the newest: most part from it at the next token
        for path in self.paths[:-1]:
            if by_newest[path.seq_id] == n:
                tokens = path.tokens
                if after < 0 or n >= len(tokens) or after == tokens[n]:
                    shared[path.seq_id] = n + common_prefix(array[n:], tokens[n:])
        shared[newest.seq_id] = n
        return shared

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

    def move(self, path: CachedPath, seq_id: int) -> list[KvOp]:
        """Move an unpinned path's cells to the empty sequence `seq_id`, its id from now on;
        returns the ops (its cells tagged with the new id, the old one emptied)."""
        assert not path.pins, "a running request forks from this path's id"
        old, path.seq_id = path.seq_id, seq_id
        for other in self.paths:
            if other is not path:
                other.shared[seq_id] = other.shared.pop(old)
        self.generation += 1
        return [KvOp(old, seq_id), KvOp.remove(old)]

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
    forks: from a cached path, which stays pinned while it runs, or from a running
    request's sequence, whose cells that request counts) plus `max_tokens` cells per
    branch, until it ends. Then, with the cache on, its branches' cells are parked as
    cached paths. Cells forked from a running request are a loan, counted by the lender
    only: requests joined by loans keep their reservations until all of them have ended,
    then are parked together, lenders first, so that the cells they share are counted
    once. A running request always wins: admission evicts cached paths (least recently
    used first) until it fits.

    The one writer of the prefix index (engine/prefix_index.py): the running requests'
    reservations are registered there, cached paths and tier entries read from here.
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
        self.index = PrefixIndex(self.cache, self.tiers, n_cells)
        self._free_ids = list(range(self.n_seq - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        # Backend sampling (engine/device_cut.py): ids below `chained` carry the device's
        # cut; requests it serves (`prefers_chain`) get them first, others the rest first.
        self.chained = 0
        self.prefers_chain: Callable[[Request], bool] = lambda request: False
        self.live = 0  # live sequences
        self.cells_reserved = 0

    @property
    def free_ids(self) -> int:
        return len(self._free_ids)

    def idle_seq_ids(self) -> list[int]:
        """The sequence ids nothing holds now."""
        return list(self._free_ids)

    def kept_paths(self) -> list[tuple[int, list[int]]]:
        """The ended branches whose cells a reservation still holds (its request runs, or a
        running request borrows its cells), as (sequence id, the tokens its cells hold)."""
        return [path for r in self.index.live.values() for path in r.finished]

    def sources(self) -> list[Source]:
        """What each reservation's prompt was forked (or restored) from, in admission order."""
        return [r.source for r in self.index.live.values()]

    @property
    def cells_used(self) -> int:
        return self.cells_reserved + self.cache.cells()

    def fits_ever(self, request: Request) -> bool:
        return request.n_branches <= self.max_live and request.cells_needed <= self.n_cells

    def new_step(self) -> None:
        """A step is being planned: the last one's restores are settled."""
        self.index.new_step()

    def match(self, request: Request) -> Source:
        """Where the prompt's prefix comes from and how many tokens it provides (at most
        all but the last: that one is decoded again to give the first logits): the prefix
        index's longest source (engine/prefix_index.py)."""
        if not self.cache.enabled or request.prompt_logprobs:  # echo+logprobs: score it all
            return NO_SOURCE
        return self.index.longest(request)

    def cells_to_reserve(self, request: Request) -> int:
        """The cells admitting the request now would reserve: all but what it forks; a
        restore loads a whole entry before it is cut to the shared prefix."""
        found = self.match(request)
        if found.entry is not None:
            return max(request.cells_needed, len(found.entry))
        return request.cells_needed - found.shared

    def can_admit(self, request: Request) -> bool:
        source = self.match(request).path
        evictable = sum(1 for p in self.cache.paths if not p.pins and p is not source)
        return (
            self.live + request.n_branches <= self.max_live
            and request.n_branches <= self.free_ids + evictable
            and self.cells_reserved
            + self.cells_to_reserve(request)
            + self.cache.pinned_cells(source)
            <= self.n_cells
        )

    def restore_failed(self, request: Request) -> None:
        """llama.cpp refused a tier's bytes: the request reads its whole prompt."""
        reservation = self.index.live[request]
        reservation.floor, reservation.source = 0, NO_SOURCE
        self.index.forget()

    def shortage(self, request: Request) -> Shortage:
        """What keeps a request that `can_admit` refuses waiting."""
        if self.live + request.n_branches > self.max_live:
            return Shortage.SEQUENCES
        return Shortage.CELLS

    def admit(self, request: Request) -> Grant:
        """Reserve ids and cells, fork from the prefix index's longest source."""
        assert self.can_admit(request)
        found = self.match(request)
        path, entry, lender = found.path, found.entry, found.lender
        if path is not None:
            path.pins += 1
            self.cache.touch(path)
        need = self.cells_to_reserve(request)
        floor = path.floor if path is not None else entry.floor if entry is not None else 0
        if lender is not None:
            floor = self.index.live[lender].floor
        reservation = Reservation(request.prompt_len - (request.cells_needed - need), found, floor)
        if lender is not None:
            reservation.loans[lender] = found.shared
        ops = self._evict_until(
            lambda: (
                self.free_ids >= request.n_branches
                and self.cells_reserved + need + self.cache.cells() <= self.n_cells
            )
        )
        seq_ids = tuple(self._take_ids(request, request.n_branches, ops))
        self.live += request.n_branches
        self.cells_reserved += need
        if found.seq_id >= 0:  # a cached path's or a running request's cells
            ops.append(KvOp(found.seq_id, seq_ids[0], 0, found.shared))
        elif entry is not None:
            ops.append(KvRestore(-1, seq_ids[0], 0, found.shared, entry=entry))
            self.index.restoring.add(seq_ids[0])
            self.index.forget()  # others waiting for this entry now fork from here
        self.index.add(request, reservation)
        return Grant(seq_ids, found.shared, tuple(ops), found)

    def borrow(self, request: Request) -> tuple[KvOp | None, int, bool]:
        """A prompt being read forks more of itself from the sequence of a request admitted
        before it, if one holds more now (its prompt read further, a branch's text). Those
        cells are its lender's to count: the reservation shrinks by them. Returns the op,
        the prompt tokens the request then holds, and whether a request still reading its
        own prompt will provide more (then it waits a step rather than compute them)."""
        reservation = self.index.live[request]
        start = request.n_prefilled
        found = self.index.find(request, request.prompt_len - 1, before=request)
        source, op = found.source, None
        if source.lender is not None and source.shared > start:
            lent = source.shared - start
            reservation.loans[source.lender] = reservation.loans.get(source.lender, 0) + lent
            reservation.prompt_cells -= lent
            self.cells_reserved -= lent
            op = KvOp(source.seq_id, request.primary.seq_id, start, source.shared)
            start = source.shared
        return op, start, found.promised > start

    def refill_cells(self, request: Request) -> int:
        """The cells a refilled branch reserves: `max_tokens`, + 1 once the prompt is read
        (its last token is decoded again in the new sequence)."""
        return request.params.max_tokens + int(request.status is RequestStatus.DECODING)

    def add_sequence(self, request: Request) -> tuple[int, list[KvOp]] | None:
        """A branch for a running request in place of one about to end (live branching's
        refill): a sequence id and its cells, `max_tokens` (+ 1 once the prompt is read:
        its last token is decoded again in the new sequence). None when they do not fit
        now; cached paths make way if they must. Live sequences count one over until the
        other ends."""
        need = self.refill_cells(request)
        extra = need - request.params.max_tokens
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
        self.index.live[request].prompt_cells += extra  # returned with the prompt's
        return self._take_ids(request, 1, ops)[0], ops

    def _take_ids(self, request: Request, count: int, ops: list[KvOp]) -> list[int]:
        """Free ids for `count` branches of `request`: with backend sampling, ids that carry
        the device's cut if it serves the request (cached paths parked on them move to
        ids without it, their ops added to `ops`), else ids without it, as far as free."""
        chained = self.prefers_chain(request)
        if chained and self.chained:
            ops += self._clear_chained(count)
        return [self._take_id(chained) for _ in range(count)]

    def _clear_chained(self, wanted: int) -> list[KvOp]:
        """Up to `wanted` free ids that carry the device's cut: the cached paths parked on
        them (least recently used first; a host-path request that found no other id left
        them there) move to free ids without it. Else a request the cut serves would get
        ids without it, read whole rows, and have llama.cpp copy all of its calls' rows."""
        ops: list[KvOp] = []
        free = sum(1 for seq_id in self._free_ids if seq_id < self.chained)
        parked = [p for p in self.cache.paths if p.seq_id < self.chained and not p.pins]
        for path in sorted(parked, key=lambda p: p.last_used)[: max(0, wanted - free)]:
            unchained = self._pop_free(False)
            if unchained is None:
                break
            self._free_ids.append(path.seq_id)
            ops += self.cache.move(path, unchained)
        return ops

    def _take_id(self, chained: bool) -> int:
        """A free sequence id, one that carries the device's cut (or not) if any is free."""
        found = self._pop_free(chained) if self.chained else None
        return self._free_ids.pop() if found is None else found

    def _pop_free(self, chained: bool) -> int | None:
        """A free id that carries the device's cut (or one that does not), or None."""
        ids = self._free_ids
        for at in range(len(ids) - 1, -1, -1):
            if (ids[at] < self.chained) == chained:
                return ids.pop(at)
        return None

    def release_sequence(
        self, request: Request, seq_id: int, path: list[int] | None, keep: bool = True
    ) -> list[KvOp]:
        """A branch ended. With `path` (the tokens its cells hold) and the cache on, its
        cells stay until the request's reservation is released, to be parked then (not
        with `keep` False: a failed request's, kept only while lent, then removed), and
        the room it did not use is free now (for a fork, a refill, another request);
        otherwise all of it goes now."""
        self.live -= 1
        reservation = self.index.live[request]
        if path and self.cache.enabled and (keep or self._lent(request)):
            self.cells_reserved -= request.params.max_tokens - _generated(request, path)
            reservation.finished.append((seq_id, path))
            reservation.discard |= not keep
            return []
        self.cells_reserved -= request.params.max_tokens
        self._free_ids.append(seq_id)
        return [KvOp.remove(seq_id)]

    def release_request(self, request: Request) -> list[KvOp]:
        """The request ended (every branch released): its reservation is released, its
        branches parked, once no running request borrows its cells; until then they stay
        counted (and may be forked), the room its prompt never read freed now."""
        reservation = self.index.live[request]
        reservation.ended = True
        unread = 0
        if request.status is RequestStatus.PREFILLING:  # ended while its prompt was read
            unread = max(0, request.prompt_len - request.n_prefilled)
        reservation.prompt_cells -= unread
        self.cells_reserved -= unread
        if not reservation.finished:  # it holds no cells: none to lend, none to park
            return self._release(request) + self._settle()
        return self._settle()

    def _lent(self, request: Request) -> bool:
        """Whether a request still registered borrows cells of `request`'s."""
        return any(request in r.loans for r in self.index.live.values())

    def _settle(self) -> list[KvOp]:
        """Release the reservations of ended requests whose cells no running request shares:
        requests joined by loans (either way) go together once all have ended, lenders
        first, so that a borrower's path is parked beside its lender's and their shared
        cells are counted once. Then the cache is kept within its bounds."""
        live = self.index.live
        group = {request: request for request in live}

        def root(request: Request) -> Request:
            while group[request] is not request:
                request = group[request]
            return request

        for borrower, reservation in live.items():
            for lender in reservation.loans:
                group[root(borrower)] = root(lender)
        running = {root(r) for r, res in live.items() if not res.ended}
        ops: list[KvOp] = []
        for request in [r for r in live if root(r) not in running]:  # in admission order
            ops += self._release(request)
        return ops + self._evict_until(
            lambda: (
                self.cache.idle_cells() <= self.cache.max_idle_cells
                and self.cells_used <= self.n_cells
            )
        )

    def _release(self, request: Request) -> list[KvOp]:
        """Return a reservation's cells and park (or remove) its ended branches' paths."""
        reservation = self.index.remove(request)
        if reservation.source.path is not None:  # first: a source the new paths cover may go
            reservation.source.path.pins -= 1
        self.cells_reserved -= reservation.prompt_cells
        self.cells_reserved -= sum(_generated(request, path) for _, path in reservation.finished)
        ops: list[KvOp] = []
        for seq_id, path in reservation.finished:
            if reservation.discard:
                ops.append(KvOp.remove(seq_id))
                self._free_ids.append(seq_id)
                continue
            cells_on = None
            if seq_id < self.chained and (unchained := self._pop_free(False)) is not None:
                # The ids that carry the device's cut are for live branches: a path parked on
                # one would leave a later request of --max-n branches some without it.
                self._free_ids.append(seq_id)
                seq_id, cells_on = unchained, seq_id
            park_ops, freed = self.cache.park(
                seq_id, path, reservation.floor, request.prompt_len, cells_on
            )
            ops += park_ops
            self._free_ids.extend(freed)
        return ops

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

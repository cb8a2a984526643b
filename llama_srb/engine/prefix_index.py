"""One index of every place a prompt's prefix may come from, with one set of rules.

A prompt's first tokens may already be somewhere: in the cells of a cached path (a
finished branch parked by the prefix cache), in a lower tier (host memory or disk), or in
the cells of a running request: its prompt (read, or still being read), a branch's text
so far, or the text of a branch that ended while its request runs. `PrefixIndex.longest`
answers "the longest source for these tokens" over all of them, for admission (a Grant
forks from what it finds) and for a prompt being read (more from a running request that
has read further since).

Written by one owner: `KvBudget` (engine/kv.py) registers every running request's
Reservation here when it admits it and removes it when its cells are parked; cached paths
and tier entries are read from the prefix cache and the tier store it owns. The index reads
the running requests' state (status, prompt read, tokens released) and never writes it.

The rules, the same for every source:
- **At most all but the prompt's last token**: that one is decoded again for its logits.
- **Only a prefix worth sharing**: at least `MIN_SHARED_TOKENS`, unless the prompt goes on
  past the source's own prompt into its generated text (a fork of a branch: the writer's
  loop, worth any length). A BOS token or a few tokens are computed rather than pinned.
- **Never below a floor**: cells restored from a tier for a sliding-window model are exact
  only from their end (`floor`); a fork shares at least that many tokens of them.
- **Only what a source holds now**: a prompt still being read provides what it has read
  (and promises the rest: the asker may wait a step for it, `Found.promised`); a
  sequence whose cells arrive with this step's restore holds nothing until they are there;
  a streaming branch provides its released tokens only (text a banned-phrase rewind could
  still take back is never forked).
- **Cells before bytes**: in live cells, the longest wins; on a tie, a cached path (the
  shortest: pinning it holds the fewest cells) before a running request's sequence. A tier
  entry is restored only when it provides at least `MIN_SHARED_TOKENS` more, and only one
  request loads an entry at a time (the others fork from its cells once they are there).
- **Earlier lenders only**: a request shares only from requests admitted before it, so no
  two ever wait on each other.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from llama_srb.engine.request import Branch, Request, RequestStatus
from llama_srb.engine.tiers import TierEntry, TierStore

# Shorter shared prefixes are computed again rather than forked: they save a few ms of
# prefill, and forking would pin the whole cached path for as long as the request runs.
MIN_SHARED_TOKENS = 32

Tokens = npt.NDArray[np.int32]


def as_tokens(tokens: Sequence[int]) -> Tokens:
    return np.asarray(tokens, dtype=np.int32)


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


class CachedPaths(Protocol):
    """What the index reads of the prefix cache (engine/kv.py's PrefixCache)."""

    @property
    def paths(self) -> list[CachedPath]: ...
    @property
    def generation(self) -> int: ...


class SourceKind(enum.Enum):
    NONE = "none"
    CACHED = "cached"  # a cached path's cells: pinned while the request runs
    TIER = "tier"  # a tier entry's bytes, restored into the request's first sequence
    LIVE = "live"  # a running request's sequence: its cells lent until the lender's end


@dataclass(frozen=True)
class Source:
    """Where `shared` tokens of a prompt come from: a cached `path`, a tier `entry`, or the
    sequence `seq_id` of a running request (`lender`); none of them for no source."""

    shared: int = 0
    path: CachedPath | None = None
    entry: TierEntry | None = None
    lender: Request | None = None
    seq_id: int = -1

    @property
    def kind(self) -> SourceKind:
        if self.path is not None:
            return SourceKind.CACHED
        if self.entry is not None:
            return SourceKind.TIER
        if self.lender is not None:
            return SourceKind.LIVE
        return SourceKind.NONE


NO_SOURCE = Source()


@dataclass(frozen=True)
class Found:
    """The answer for a prompt being read: the best live source now, and how far a running
    request still reading its own prompt will take it once read (0: none will)."""

    source: Source = NO_SOURCE
    promised: int = 0


@dataclass
class Reservation:
    """What a running request holds beyond its live branches' sequence ids (kv.py counts
    its cells; the index offers them to later prompts)."""

    prompt_cells: int  # prompt cells this request computes itself
    source: Source = NO_SOURCE  # what its prompt's start was forked (or restored) from
    floor: int = 0  # forks from its cells share at least this many tokens
    # Cells of earlier requests' sequences forked into its prompt, by lender: counted by
    # the lender, which keeps them (and its reservation) until this one ends. Requests
    # joined by loans are released together, lenders first (kv.py `KvBudget._settle`).
    loans: dict[Request, int] = field(default_factory=dict)
    # Ended branches, (sequence id, tokens its cells hold): parked when the request's
    # reservation is released, so that it still counts their cells until then.
    finished: list[tuple[int, list[int]]] = field(default_factory=list)
    ended: bool = False  # the request ended; kept while one joined to it by loans runs
    discard: bool = False  # its cells are not worth caching (it failed): removed, not parked


@dataclass(frozen=True)
class _Held:
    """A sequence of a running request as a source: the tokens it shares with a prompt,
    the cells it holds now, and whether it is a prompt still being read."""

    seq_id: int
    common: int
    held: int
    reading: bool = False


class PrefixIndex:
    """Cached paths, tier entries and running requests' sequences under one lookup."""

    def __init__(self, cache: CachedPaths, tiers: TierStore | None, n_cells: int) -> None:
        self.cache = cache
        self.tiers = tiers
        self.n_cells = n_cells
        # Running requests (and ended ones whose cells are still lent), in admission order.
        self.live: dict[Request, Reservation] = {}
        self.restoring: set[int] = set()  # sequences whose cells come with this step's restore
        # Per lender: the common prefix of its prompt with each asker's (prompts are fixed).
        self._prompt_common: dict[Request, dict[Request, int]] = {}
        # Per asker: its cached/tier answer, as of one generation of the cache and tiers.
        self._memo: dict[Request, tuple[Source, Source]] = {}
        self._memo_of = (-1, -1)

    # -- the owner's writes (KvBudget) --------------------------------------------------

    def add(self, request: Request, reservation: Reservation) -> None:
        self.live[request] = reservation
        self._prompt_common[request] = {}
        self._memo.pop(request, None)

    def remove(self, request: Request) -> Reservation:
        self._prompt_common.pop(request, None)
        for commons in self._prompt_common.values():
            commons.pop(request, None)
        return self.live.pop(request)

    def new_step(self) -> None:
        """The previous step's restores are settled (failures were reported)."""
        self.restoring.clear()

    def forget(self) -> None:
        """A restore started or failed: memoized tier answers are stale."""
        self._memo_of = (-1, -1)

    # -- the lookup -----------------------------------------------------------------------

    def longest(self, request: Request) -> Source:
        """The longest source of a waiting request's prompt: a cached path or a running
        request's sequence (what it holds now), or a tier entry that provides enough
        more."""
        limit = request.prompt_len - 1
        best, entry = self._stored(request, limit)
        live = self.find(request, limit, before=None).source
        if live.shared > best.shared:
            best = live
        if entry.shared - best.shared >= MIN_SHARED_TOKENS:
            best = entry
        return best

    def find(self, request: Request, limit: int, before: Request | None) -> Found:
        """The longest source among running requests' sequences (admitted before `before`,
        when given), for at most `limit` tokens of `request`'s prompt; and how far one
        still reading its own prompt promises to take it."""
        best, promised = NO_SOURCE, 0
        for lender, reservation in self.live.items():
            if lender is before:
                break
            if lender is request:
                continue
            for held in self._sequences(request, lender, reservation):
                common = min(held.common, limit)
                shared = min(common, held.held)
                if not worth(common, reservation.floor, lender.prompt_len) or (
                    shared < reservation.floor
                ):
                    continue
                if shared > best.shared:
                    best = Source(shared, lender=lender, seq_id=held.seq_id)
                if held.reading:
                    promised = max(promised, common)
        return Found(best, promised)

    def _stored(self, request: Request, limit: int) -> tuple[Source, Source]:
        """The best cached path, and the tier entry that provides the most: memoized until
        the cache or the tiers change (admission asks every step while a request waits)."""
        generations = (self.cache.generation, self.tiers.generation if self.tiers else 0)
        if self._memo_of != generations:
            self._memo, self._memo_of = {}, generations
        memo = self._memo.get(request)
        if memo is not None:
            return memo
        tokens = as_tokens(request.prompt)
        best = NO_SOURCE
        for path in self.cache.paths:
            common = min(common_prefix(tokens, path.tokens), limit)
            if not worth(common, path.floor, path.prompt_len or len(path)):
                continue
            # Not a path pinned beside the request it could never fit: computed instead.
            if request.cells_needed - common + len(path) > self.n_cells:
                continue
            if common > best.shared or (
                common == best.shared and best.path is not None and len(path) < len(best.path)
            ):
                best = Source(common, path=path, seq_id=path.seq_id)
        entry = NO_SOURCE
        if self.tiers is not None:
            for candidate in self.tiers.entries:
                common = min(common_prefix(tokens, candidate.tokens), limit)
                if (
                    common > entry.shared
                    and worth(common, candidate.floor, len(candidate))
                    and len(candidate) <= self.n_cells
                    and not any(r.source.entry is candidate for r in self.live.values())
                ):
                    entry = Source(common, entry=candidate)
        self._memo[request] = best, entry
        return best, entry

    def _sequences(
        self, request: Request, lender: Request, reservation: Reservation
    ) -> Iterator[_Held]:
        """The sequences of a running request that `request` could fork from."""
        commons = self._prompt_common.setdefault(lender, {})
        common = commons.get(request)
        if common is None:
            common = commons[request] = common_prefix(request.prompt, lender.prompt)
        if lender.status is RequestStatus.PREFILLING:
            holder = lender.primary.seq_id
            held = 0 if holder in self.restoring else lender.n_prefilled
            yield _Held(holder, common, held, reading=True)
        elif lender.status is RequestStatus.DECODING:
            if common < lender.prompt_len:  # it parts from the prompt: any branch will do
                if lender.live:
                    yield _Held(lender.live[0].seq_id, common, lender.prompt_len - 1)
            else:
                tail = request.prompt[common:]  # beyond the prompt: a branch's text?
                for branch in lender.live:
                    if not branch.tokens:  # a refill before its first token: the prompt's
                        yield _Held(branch.seq_id, common, lender.prompt_len - 1)
                        continue
                    stable = stable_tokens(branch)
                    shared = common + common_prefix(tail, branch.tokens[:stable])
                    yield _Held(branch.seq_id, shared, lender.prompt_len + stable)
        for seq_id, path in [] if reservation.discard else reservation.finished:
            shared = common
            if common == lender.prompt_len:
                shared += common_prefix(request.prompt[common:], path[common:])
            yield _Held(seq_id, min(shared, len(path)), len(path))


def stable_tokens(branch: Branch) -> int:
    """A decoding branch's tokens whose cells are decoded and will never be taken back:
    its released ones (a banned-phrase rewind never reaches them), but not its newest,
    which is decoded next."""
    newest = len(branch.tokens) - 1
    return min(newest, branch.text.released) if branch.text is not None else newest


def worth(common: int, floor: int, source_prompt: int) -> bool:
    """Whether `common` tokens of a source are worth forking: past the source's own prompt
    any length is (a fork of its text), else at least MIN_SHARED_TOKENS; never below the
    source's floor."""
    least = floor if common > source_prompt else max(MIN_SHARED_TOKENS, floor)
    return common >= least and common > 0

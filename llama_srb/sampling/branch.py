"""A branch's sampler: its chain run as head → cut → finish over one logits row
(sampling/chain.py says which sampler runs where), and what choosing between branches asks
of it: per-branch settings (`choices_params`), taking tokens back (a banned phrase began
there), and a first token that no earlier branch of the request drew (`distinct_openings`).

Per token, a branch reads its row once, into its column maxima (sampling/cut.py);
llama.cpp's samplers see only the few tokens the head can change and the cut's survivors.
With a grammar (sampling/constraint.py), the tokens it does not allow are masked first,
from the masks the engine computed for the whole step.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import llama_cpp as C
import numpy as np
import numpy.typing as npt

from llama_srb.native import Model, SamplerChain
from llama_srb.sampling.chain import (
    REMEMBERING,
    ChainPlan,
    CutKind,
    build,
    history_window,
    make,
    plan_chain,
)
from llama_srb.sampling.constraint import GRAMMAR_COMPLETE, Matcher
from llama_srb.sampling.cut import Ids, Row, Vector, most_likely_first, top_p
from llama_srb.sampling.device_row import DeviceRow, Undecided
from llama_srb.sampling.masks import Bitmask
from llama_srb.sampling.params import SamplingParams

# llama_token_data: {int32 id; float logit; float p}, 12 bytes, no padding.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# After a pick the device's candidates could not prove, the whole rows a chain reads before
# it tries them again: this many, doubled for each such pick in a row (up to 16 times).
WHOLE_ROWS_AFTER_UNDECIDED = 16
Survivors = npt.NDArray[np.void]  # llama_token_data records
# A device-decided chain as sampling/_rows.c's pick_candidates reads it: its finish
# chain's address (0: greedy), its cut (DEVICE_CUTS), top-k, scale and log(min-p).
DevicePick = tuple[int, int, int, float, float]
DEVICE_CUTS = {CutKind.GREEDY: 0, CutKind.TOP_K: 1, CutKind.MIN_P: 2}


@functools.lru_cache(maxsize=4)
def token_ids(n_vocab: int) -> npt.NDArray[np.int32]:
    return np.arange(n_vocab, dtype=np.int32)


@functools.lru_cache(maxsize=16)
def minus_inf(n: int) -> Vector:
    """n masked logits (read-only): the same few ids are masked on every token."""
    values = np.full(n, -np.inf, np.float32)
    values.flags.writeable = False
    return values


def min_p_threshold(top: float, params: SamplingParams, plan: ChainPlan) -> float:
    """The least logit a min-p keeps, for a row whose largest is `top` (llama.cpp's min-p
    over logits, at the scale of the temperatures before it)."""
    return top + math.log(params.min_p) / plan.scale


class Candidates:
    """A llama_token_data array that a branch fills and runs its llama.cpp samplers over,
    reused from token to token (an array and its C struct cost more than the samplers
    themselves at these sizes)."""

    REUSED = 1 << 14  # larger arrays (every token, for the rare whole-row chains) are not kept

    def __init__(self) -> None:
        self._data = np.empty(0, TOKEN_DATA)
        self._base = self._data.ctypes.data
        self._array = C.llama_token_data_array()
        self._ref = ctypes.byref(self._array)
        # its first field, `data`, read and written as a number
        self._pointer = ctypes.c_void_p.from_buffer(self._array)

    def run(
        self, chain: SamplerChain, ids: npt.NDArray[Any], logits: Vector, ordered: bool = True
    ) -> tuple[int, Survivors]:
        """llama.cpp's `chain` over the candidates (ids, logits), most likely first when
        `ordered`: its pick (-1 if it has none) and the candidates that survive its
        filters (valid until the next run)."""
        n = len(ids)
        if n <= len(self._data):
            data, base = self._data, self._base
        else:
            data = np.empty(n, TOKEN_DATA)
            base = data.ctypes.data
            if n <= self.REUSED:
                self._data, self._base = data, base
        data = data[:n]
        data["id"], data["logit"], data["p"] = ids, logits, 0.0
        array = self._array
        self._pointer.value = base
        array.size, array.selected, array.sorted = n, -1, ordered
        C.llama_sampler_apply(chain.ptr, self._ref)
        # Filters may move the array's start (XTC drops the top) as well as shorten it.
        start = ((self._pointer.value or 0) - base) // TOKEN_DATA.itemsize
        survivors = data[start : start + array.size]
        token = int(survivors["id"][array.selected]) if array.selected >= 0 else -1
        return token, survivors


class TokenWindow:
    """The distinct tokens among a branch's latest `size`: all a remembering sampler
    (penalties, DRY) can change."""

    def __init__(self, size: int) -> None:
        self._recent: deque[int] = deque(maxlen=max(size, 1))
        self._counts: dict[int, int] = {}

    def push(self, token: int) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._recent.append(token)
        self._counts[token] = self._counts.get(token, 0) + 1

    def reset(self, tokens: Sequence[int]) -> None:
        self._recent.clear()
        self._counts.clear()
        for token in tokens[-self._recent.maxlen :] if self._recent.maxlen else ():
            self.push(token)

    def ids(self) -> Ids:
        return np.fromiter(self._counts, np.int64, len(self._counts))


class BranchSampler:
    """Owns one branch's llama.cpp samplers and runs its plan over a row per token."""

    def __init__(
        self,
        plan: ChainPlan,
        params: SamplingParams,
        seed: int,
        head: SamplerChain | None,
        finish: SamplerChain | None,
        first_cut: SamplerChain | None = None,
        history: tuple[tuple[SamplerChain, int, int], ...] = (),
        matcher: Matcher | None = None,
    ) -> None:
        """`first_cut`: llama.cpp's own top-p, for a row whose cut its columns cannot
        decide. `history`: the remembering samplers, as (chain, position, window).
        `matcher`: the branch's place in the request's grammar."""
        self.plan = plan
        self.params = params
        self.seed = seed
        self.head = head
        self.finish = finish
        self.first_cut = first_cut
        self.history = history
        self.matcher = matcher
        self._accepted = 0  # tokens the matcher has consumed
        self._window = TokenWindow(max((w for _, _, w in history), default=0)) if head else None
        bias = sorted(params.logit_bias)
        self._bias: tuple[Ids, Vector] | None = None
        if bias:
            ids, values = zip(*bias, strict=True)
            self._bias = (np.array(ids, np.int64), np.array(values, np.float32))
        self._rng: np.random.Generator | None = None
        self._candidates = Candidates()
        # The fewest of a row's most likely tokens that can decide this chain's pick (a
        # top-k's k; 1 for greedy, and for a min-p, whose kept set is the row's own): what
        # a device's top-K must hold (sampling/device_row.py). None for a chain that raises
        # a token or reads further (bias, penalties, DRY, a grammar, top-p's normalizer).
        self._device_k: int | None = None
        if head is None and self._bias is None and matcher is None:
            if plan.cut in (CutKind.GREEDY, CutKind.MIN_P):
                self._device_k = 1
            elif plan.cut is CutKind.TOP_K:
                self._device_k = params.top_k
        # The same, for the C loop that makes a call's picks from its candidates at once.
        self._device_pick: DevicePick | None = None
        if self._device_k is not None:
            greedy = plan.cut is CutKind.GREEDY
            self._device_pick = (
                0 if finish is None else finish.address,
                DEVICE_CUTS[plan.cut],
                params.top_k,
                1.0 if greedy else plan.scale,
                math.log(params.min_p) if plan.cut is CutKind.MIN_P else 0.0,
            )
        self._undecided = 0  # picks in a row the candidates could not prove
        self._whole_rows_left = 0  # whole rows to read before trying the candidates again

    @property
    def device_k(self) -> int | None:
        """`_device_k`, unless the candidates failed this chain lately: a row whose pick
        they cannot prove costs a decode of its own (engine/device_cut.py), so a flat
        distribution (a wide min-p) reads whole rows for a while, longer each time."""
        return None if self._whole_rows_left else self._device_k

    @property
    def device_pick(self) -> DevicePick | None:
        """What the C loop needs to make this chain's pick from a device row, when
        `device_k` says the candidates may decide it."""
        return None if self._whole_rows_left else self._device_pick

    def picked_on_device(self) -> None:
        """The C loop made (and accepted) this step's pick: the candidates decided it."""
        self._undecided = 0

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed & 0xFFFFFFFF)
        return self._rng

    def close(self) -> None:
        for chain in (self.head, self.finish, self.first_cut):
            if chain is not None:
                chain.close()

    # -- one token -----------------------------------------------------------------------

    def sample(
        self,
        row: Row | DeviceRow,
        forbidden: Ids | None = None,
        taken: set[int] | None = None,
        mask: Bitmask | None = None,
    ) -> int:
        """The branch's next token from `row`, never one of `forbidden` (sorted distinct
        ids: end-of-generation masked, banned at this position) nor one the grammar's
        `mask` refuses; with `taken` (distinct openings), one no earlier branch drew while
        the chain leaves any. Accepted, as llama_sampler_sample does; GRAMMAR_COMPLETE
        when the grammar allows nothing more. From a DeviceRow, Undecided (nothing
        accepted) when its candidates cannot prove the pick."""
        if isinstance(row, DeviceRow):
            assert taken is None and mask is None, "these read the whole row"
            return self._sample_device(row, forbidden)
        if self._whole_rows_left:
            self._whole_rows_left -= 1
        if mask is not None:  # in place: a row is one branch's, or all at a grammar's start
            row.mask(mask)
        unfiltered = self.plan.cut in (CutKind.GREEDY, CutKind.DRAW)
        if taken and unfiltered:  # nothing filters: the taken ones are simply ruled out
            taken_ids = np.fromiter(taken, np.int64, len(taken))
            both = taken_ids if forbidden is None else np.concatenate([forbidden, taken_ids])
            forbidden, taken = np.unique(both), None
        self._patch(row, forbidden)
        try:
            if mask is not None and row.max == -np.inf:
                return GRAMMAR_COMPLETE
            token = self._choose(row, taken)
        finally:
            row.restore()
        self.accept(token)
        return token

    def _sample_device(self, row: DeviceRow, forbidden: Ids | None) -> int:
        """The chain's pick from the device's candidates, as `sample` picks from the row
        (a chain with a `device_k`: its cut is the greedy pick, a top-k or a min-p)."""
        assert self._device_k is not None
        plan = self.plan
        if forbidden is not None and len(forbidden):
            row.patch(forbidden, minus_inf(len(forbidden)))
        try:
            if plan.cut is CutKind.GREEDY:
                token = row.argmax()
            else:
                assert self.finish is not None
                if plan.cut is CutKind.TOP_K:
                    ids, values, *_ = row.top_k(self._device_k)
                else:
                    ids, values = row.at_least(min_p_threshold(row.max, self.params, plan))
                if plan.scale != 1.0:
                    values = values * np.float32(plan.scale)
                token = self._candidates.run(self.finish, ids, values)[0]
        except Undecided:
            self._whole_rows_left = WHOLE_ROWS_AFTER_UNDECIDED << min(self._undecided, 4)
            self._undecided += 1
            raise
        finally:
            row.restore()
        self._undecided = 0
        self.accept(token)
        return token

    def accept(self, token: int) -> None:
        for chain in (self.head, self.finish):
            if chain is not None:
                C.llama_sampler_accept(chain.ptr, token)
        if self._window is not None:
            self._window.push(token)
        if self.matcher is not None:
            self.matcher.consume(token)  # an allowed token; a refused one sets its error
            self._accepted += 1

    def _patch(self, row: Row, forbidden: Ids | None) -> None:
        """The head over the tokens it can change: masked ones to -inf, then the bias, the
        penalties and DRY (llama.cpp's own), as the chain's first samplers would."""
        bias_ids = self._bias[0] if self._bias is not None else None
        parts = [p for p in (bias_ids, forbidden) if p is not None and len(p)]
        if self._window is not None:
            parts.append(self._window.ids())
        if not parts:
            return
        if len(parts) == 1 and parts[0] is forbidden:  # sorted and distinct, all masked
            row.patch(forbidden, minus_inf(len(forbidden)))
            return
        ids = np.unique(np.concatenate(parts))
        if not len(ids):
            return
        values = row.logits[ids]
        if forbidden is not None and len(forbidden):
            values[np.searchsorted(ids, forbidden)] = -np.inf
        if self._bias is not None:
            np.add.at(values, np.searchsorted(ids, self._bias[0]), self._bias[1])
        if self.head is not None:  # penalties and DRY change logits in place, keep every token
            values = self._candidates.run(self.head, ids, values, ordered=False)[1]["logit"]
        row.patch(ids, values)

    def filtered(self, row: Row, forbidden: Ids | None = None) -> tuple[Ids, Vector]:
        """What the chain leaves its pick to draw from, for `row`: the candidates after
        every filter, with their logits at its temperature (the pick runs, unaccepted:
        its random state moves on)."""
        self._patch(row, forbidden)
        try:
            token, kept = self._run(row)
            if kept is not None:
                return kept["id"].astype(np.int64), kept["logit"].copy()
            if self.plan.cut is CutKind.GREEDY:
                return np.array([token], np.int64), row.logits[[token]].copy()
            return token_ids(len(row.logits)).astype(np.int64), row.logits * np.float32(
                self.plan.scale
            )
        finally:
            row.restore()

    def _choose(self, row: Row, taken: set[int] | None) -> int:
        token, kept = self._run(row)
        if taken and token in taken:
            assert kept is not None  # the unfiltered picks rule taken tokens out first
            token = self._untaken(row, kept, taken)
        return token

    def _run(self, row: Row) -> tuple[int, Survivors | None]:
        """The plan over the (patched) row: its pick, and what the finish chain left."""
        plan = self.plan
        if plan.cut is CutKind.GREEDY:
            return row.argmax(), None
        if plan.cut is CutKind.DRAW:
            return row.draw(plan.scale, self.rng), None
        assert self.finish is not None
        survivors = self._cut(row)
        if survivors is not None:
            return self._candidates.run(self.finish, *survivors)
        # every candidate, through llama.cpp's own chain from its first filter
        ids, values = token_ids(len(row.logits)), row.logits
        if plan.scale != 1.0:
            values = values * np.float32(plan.scale)
        ordered = False
        if self.first_cut is not None:
            _, cut = self._candidates.run(self.first_cut, ids, values, ordered)
            ids, values, ordered = cut["id"].copy(), cut["logit"].copy(), True
        return self._candidates.run(self.finish, ids, values, ordered)

    def _cut(self, row: Row) -> tuple[Ids, Vector] | None:
        """The survivors of the chain's first filter, most likely first, at the scale of
        the temperatures before it (None: llama.cpp decides, over every candidate)."""
        plan, p = self.plan, self.params
        if plan.cut is CutKind.WHOLE:
            return None
        if plan.cut is CutKind.TOP_P:
            cap = None
            if plan.cap == "min_p":
                cap = row.at_least(min_p_threshold(row.max, p, plan))
            elif plan.cap == "top_k":
                cap = row.top_k(p.top_k)
            cut = top_p(row, p.top_p, plan.scale, cap)
            if cut is None:
                return None
            ids, values = cut
        else:
            if plan.cut is CutKind.TOP_K:
                ids, values, *_ = row.top_k(p.top_k)
                # equal logits lowest id first, as tokens_at_least gives them (and the
                # device's candidates are read: sampling/device_row.py)
                by_id = np.argsort(ids)
                ids, values = ids[by_id], values[by_id]
            else:
                ids, values = row.tokens_at_least(min_p_threshold(row.max, p, plan))
            ids, values = most_likely_first(ids, values)
        if plan.scale != 1.0:
            values = values * np.float32(plan.scale)
        return ids, values

    def _untaken(self, row: Row, kept: Survivors, taken: set[int]) -> int:
        """A draw from the survivors' distribution without the taken tokens: with the
        chain's own draw kept when it was free, exactly a draw from the filtered
        distribution conditioned on not being taken. When no survivor is free, or the
        pick is not a draw (mirostat), the most likely token of the row not taken."""
        if self.params.mirostat == 0:
            logits = kept["logit"].astype(np.float64)
            free = np.isfinite(logits) & ~np.isin(kept["id"], np.fromiter(taken, np.int32))
            if free.any():
                weights = np.exp(logits[free] - logits[free].max())
                return int(self.rng.choice(kept["id"][free], p=weights / weights.sum()))
        token = most_likely_untaken(row.logits, taken)
        # a grammar that allows only taken tokens: the opening repeats one, never breaks it
        return token if np.isfinite(row.logits[token]) else int(kept["id"][0])

    # -- taking tokens back --------------------------------------------------------------

    def rewind(self, kept: Sequence[int]) -> None:
        """Make the chain's memory what it was after accepting `kept` (its branch's tokens
        before the one a banned phrase began in).

        Reset and replay, not snapshots: a clone of a chain with penalties and DRY takes
        250-480 µs on Gemma 3 270M, which a snapshot would pay on every token of every
        branch; a replay takes ~5 µs per kept token, and only when a phrase was found.
        Only the samplers that remember are reset: a whole-chain reset would also re-seed
        dist and XTC, replaying the branch's random draws. Mirostat's running estimate
        (mu) is not rewound: it is no history."""
        for chain, position, window in self.history:
            sampler = C.llama_sampler_chain_get(chain.ptr, position)
            C.llama_sampler_reset(sampler)
            for token in kept[-window:] if window > 0 else ():
                C.llama_sampler_accept(sampler, token)
        if self._window is not None:
            self._window.reset(kept)
        if self.matcher is not None:
            self.matcher.rollback(self._accepted - len(kept))
            self._accepted = len(kept)


def most_likely_untaken(row: Vector, taken: set[int]) -> int:
    """The most likely token of `row` not in `taken` (`taken` is small: n at most)."""
    k = min(len(row), len(taken) + 1)
    top = np.argpartition(row, -k)[-k:]
    for token in top[np.argsort(-row[top], kind="stable")]:
        if int(token) not in taken:
            return int(token)
    raise ValueError("every token is taken")


def build_samplers(model: Model, params: SamplingParams, seeds: list[int]) -> list[BranchSampler]:
    """One sampler per branch; branch i uses `params.for_branch(i)` (its `choices_params`
    entry) and `seeds[i]`. Branches with the same settings share one chain build."""
    groups: dict[SamplingParams, list[int]] = {}
    for index in range(len(seeds)):
        groups.setdefault(params.for_branch(index), []).append(index)
    samplers: list[BranchSampler | None] = [None] * len(seeds)
    try:
        for branch_params, indexes in groups.items():
            group = _planned(model, branch_params, [seeds[i] for i in indexes])
            for i, built in zip(indexes, group, strict=True):
                samplers[i] = built
    except BaseException:
        for sampler in samplers:
            if sampler is not None:
                sampler.close()
        raise
    return [s for s in samplers if s is not None]


def _planned(model: Model, p: SamplingParams, seeds: list[int]) -> list[BranchSampler]:
    plan = plan_chain(p)
    chains: list[SamplerChain] = []  # closed if anything fails before the samplers own them
    try:
        heads = build(model, p, plan.head, seeds, pick=False) if plan.head else [None] * len(seeds)
        chains += [h for h in heads if h is not None]
        finished = plan.cut not in (CutKind.GREEDY, CutKind.DRAW)
        finishes = (
            build(model, p, plan.finish, seeds, pick=True) if finished else [None] * len(seeds)
        )
        chains += [f for f in finishes if f is not None]
        first_cuts = [
            SamplerChain.of([make(model, p, "top_p", 0)]) if plan.cut is CutKind.TOP_P else None
            for _ in seeds
        ]
        chains += [c for c in first_cuts if c is not None]
    except BaseException:
        for chain in chains:
            chain.close()
        raise
    samplers: list[BranchSampler] = []
    for seed, head, finish, first_cut in zip(seeds, heads, finishes, first_cuts, strict=True):
        history = tuple(
            (chain, position, history_window(model, p, name))
            for chain, names in ((head, plan.head), (finish, plan.finish))
            if chain is not None
            for position, name in enumerate(names)
            if name in REMEMBERING
        )
        matcher = p.constraint.matcher() if p.constraint is not None else None
        samplers.append(BranchSampler(plan, p, seed, head, finish, first_cut, history, matcher))
    return samplers

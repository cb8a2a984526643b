"""A branch's sampler: its llama.cpp chain, and what choosing between branches asks of it:
per-branch settings (`choices_params`), taking tokens back (a banned phrase began there),
and a first token that no earlier branch of the request drew (`distinct_openings`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as C
import numpy as np
import numpy.typing as npt

from llama_srb.native import Model, SamplerChain
from llama_srb.sampling.chain import build_chains, history_samplers
from llama_srb.sampling.grammar import (
    GRAMMAR_COMPLETE,
    TOKEN_DATA,
    ConstrainedChain,
    candidates,
    token_ids,
)
from llama_srb.sampling.params import SamplingParams

Row = npt.NDArray[np.float32]


class BranchSampler:
    """Owns one branch's chain. `history` lists the chain's samplers that remember
    accepted tokens, as (position in the chain, how many latest tokens they keep)."""

    def __init__(
        self,
        chain: SamplerChain | ConstrainedChain,
        params: SamplingParams,
        seed: int,
        history: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.chain = chain
        self.params = params
        self.seed = seed
        self.history = history
        # Greedy and mirostat pick one token, not from a distribution left for us to read.
        self._single_pick = params.greedy or params.mirostat > 0
        self._rng: np.random.Generator | None = None

    def sample(self, ctx: C.llama_context_p, batch_index: int) -> int:
        return self.chain.sample(ctx, batch_index)

    def close(self) -> None:
        self.chain.close()

    def rewind(self, kept: Sequence[int]) -> None:
        """Make the chain's memory what it was after accepting `kept` (its branch's tokens
        before the one a banned phrase began in).

        Reset and replay, not snapshots. Measured on Gemma 3 270M (README, "Choosing
        between branches"): a clone of a chain with penalties and DRY takes 250-480 µs,
        which a snapshot would pay on every token of every branch; a replay takes ~5 µs
        per kept token (~15 µs with a grammar, re-parsed by its reset), and only when a
        phrase was found. Only the samplers that remember are
        reset: a whole-chain reset would also re-seed dist and XTC, replaying the branch's
        random draws. Mirostat's running estimate (mu) is not rewound: it is no history."""
        chain = self.chain.chain if isinstance(self.chain, ConstrainedChain) else self.chain
        for position, window in self.history:
            sampler = C.llama_sampler_chain_get(chain.ptr, position)
            C.llama_sampler_reset(sampler)
            for token in kept[-window:] if window > 0 else ():
                C.llama_sampler_accept(sampler, token)
        if isinstance(self.chain, ConstrainedChain) and self.chain.grammar:
            grammar = self.chain.grammar
            C.llama_sampler_reset(grammar)  # back to the grammar's start (re-parsed)
            for token in kept:
                C.llama_sampler_accept(grammar, token)

    def opening(self, row: Row, taken: set[int]) -> int:
        """The branch's first token, never one in `taken` (drawn by earlier branches)
        while the chain leaves any other: drawn from what survives the chain's filters,
        without the taken tokens. When none is left, the most likely token of `row` not
        taken (the filters are relaxed for this one draw). Accepted like `sample`."""
        if isinstance(self.chain, ConstrainedChain):
            return self._constrained_opening(self.chain, row, taken)
        data, array = candidates(row, token_ids(len(row)))
        C.llama_sampler_apply(self.chain.ptr, ctypes.byref(array))
        # Filters may move the array's start (XTC drops the top) as well as shorten it.
        address = ctypes.cast(array.data, ctypes.c_void_p).value or 0
        start = (address - data.ctypes.data) // TOKEN_DATA.itemsize
        survivors = data[start : start + array.size]
        token = int(survivors["id"][array.selected])
        if token in taken:
            token = self._redraw(survivors, taken) if not self._single_pick else -1
            if token < 0:
                token = most_likely_untaken(row, taken)
        C.llama_sampler_accept(self.chain.ptr, token)
        return token

    def _redraw(self, survivors: npt.NDArray[np.void], taken: set[int]) -> int:
        """A draw from the survivors' distribution without the taken tokens (-1: none
        left). With the chain's own draw kept when it was free, this is exactly a draw
        from the filtered distribution conditioned on not being taken."""
        logits = survivors["logit"].astype(np.float64)
        free = np.isfinite(logits) & ~np.isin(survivors["id"], np.fromiter(taken, np.int32))
        if not free.any():
            return -1
        weights = np.exp(logits[free] - logits[free].max())
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed & 0xFFFFFFFF)
        return int(self._rng.choice(survivors["id"][free], p=weights / weights.sum()))

    @staticmethod
    def _constrained_opening(chain: ConstrainedChain, row: Row, taken: set[int]) -> int:
        """With a grammar: the taken tokens masked, the grammar's own sampling; if the
        grammar allows nothing else, the opening may repeat one (never a token it
        rejects: llama.cpp would abort)."""
        if not taken:
            return chain.sample_row(row)
        masked = row.copy()
        masked[np.fromiter(taken, np.int64)] = -np.inf
        token = chain.sample_row(masked)
        return chain.sample_row(row) if token == GRAMMAR_COMPLETE else token


def most_likely_untaken(row: Row, taken: set[int]) -> int:
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
            chains = build_chains(model, branch_params, [seeds[i] for i in indexes])
            history = history_samplers(model, branch_params)
            for i, chain in zip(indexes, chains, strict=True):
                samplers[i] = BranchSampler(chain, branch_params, seeds[i], history)
    except BaseException:
        for built in samplers:
            if built is not None:
                built.close()
        raise
    return [s for s in samplers if s is not None]

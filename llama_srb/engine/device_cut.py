"""Backend sampling (`--backend-sampling`): llama.cpp cuts each row to its K most likely
tokens inside llama_decode, on the device that computed the row, and the host reads those
K instead of the row (docs/sampling.md, "Backend sampling").

What llama.cpp does (llama-context.cpp, llama-graph.cpp), and what follows from it here:
- The cut is llama.cpp's top_k sampler, or where the rows are computed on the CPU the
  same sampler with a faster op that reads the rows where the model wrote them
  (llama_srb/_cpu_cut.c).
- A chain attached to a sequence id runs on every output row of that sequence, and on a
  dummy row in every decode where the sequence has none. So only ids below `chained` (the
  largest `n`) carry one, attached once when the context is made (an attach makes
  llama.cpp reserve its scheduler again), and requests whose chains the candidates can
  decide get those ids first (KvBudget).
- The whole rows are copied out only for a decode with an output row of a sequence that
  carries no chain, and then every row of it is. So when a row needs its whole row (its
  request's chain needs more than K tokens: top-p, min-p, penalties, logprobs, a grammar…)
  and every row of the call carries a chain, one throwaway token on the `scratch`
  sequence, which no request holds, makes llama.cpp copy them.

A row is read as its candidates when its sequence carries a chain and every branch that
samples from it has a chain they decide (`Sampler.device_k` < K; no logprobs, banned
phrases or distinct openings). A pick they cannot prove (sampling/device_row.py: a tie at
the cut, most of the K masked, a min-p wider than the K) reads the whole row after all:
the call's copy when it has one, else the row decoded again on the scratch sequence from
the branch's own cells; and its branch reads whole rows for a while (BranchSampler.device_k).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from llama_srb.engine.context import DecodeContext
from llama_srb.engine.request import Branch, Request
from llama_srb.engine.scheduler import DecodeCall
from llama_srb.engine.stats import EngineStats
from llama_srb.native import SAMPLER_ACCEPT, SAMPLER_APPLY, Batch
from llama_srb.sampling import _rows
from llama_srb.sampling.branch import DevicePick
from llama_srb.sampling.cut import Ids
from llama_srb.sampling.device_row import DeviceRow

NO_IDS = np.empty((0, 0), np.int64)
NO_VALUES = np.empty((0, 0), np.float32)
NO_FLAGS = np.empty(0, np.bool_)

# The device's cut: above llama.cpp's default top-k (40), so its default chain is decided
# on the device; 512 bytes a row to read.
DEVICE_TOP_K = 64


class Origin(NamedTuple):
    """What an output row was computed for: a token of a sequence at a position."""

    seq_id: int
    token: int
    pos: int


@dataclass
class CallRows:
    """One decode call's output rows as the sampling stage reads them. `chunk_rows`: each
    prompt chunk's last output row (-1: none). `device`: the rows read as their candidates,
    with where each came from. `whole`: llama.cpp copied every row out whole."""

    chunk_rows: list[int]
    device: dict[int, Origin] = field(default_factory=dict)
    whole: bool = True
    scratch: bool = False  # the scratch token was added to make it so
    # after the decode: the device rows' candidates in `device`'s order (sorted: most
    # likely first), whether each holds end of generation, and each row's slot in them
    ids: Ids = field(default_factory=lambda: NO_IDS)
    values: npt.NDArray[np.float32] = field(default_factory=lambda: NO_VALUES)
    holds_eog: npt.NDArray[np.bool_] = field(default_factory=lambda: NO_FLAGS)
    slots: dict[int, int] = field(default_factory=dict)
    decoded_again: dict[int, npt.NDArray[np.float32]] = field(default_factory=dict)

    @property
    def candidate_bytes(self) -> int:
        """What the host reads of llama.cpp's output for a row of candidates: ids and
        logits, 4 bytes each (as DeviceRow.nbytes)."""
        return 8 * self.ids.shape[1]


class DeviceCut:
    """`k`: the device's cut. Sequence ids below `chained` carry it; `scratch` carries
    none and is no request's. `bos`: the scratch token. A vocabulary of at most `k`
    tokens is cut to all of them. `eog_tokens`: the model's end-of-generation tokens (a
    row that holds none needs no mask of them)."""

    def __init__(
        self,
        ctx: DecodeContext,
        stats: EngineStats,
        k: int,
        chained: int,
        scratch: int,
        bos: int,
        n_vocab: int,
        eog_tokens: tuple[int, ...],
    ) -> None:
        self.ctx = ctx
        self.stats = stats
        self.k = k
        self.chained = chained
        self.scratch = scratch
        self.bos = bos
        self.complete = n_vocab <= k
        self._eog = np.array(eog_tokens, np.int64)
        self._one = Batch(1)
        # _buffers' room, flat
        self._ids, self._values = np.empty(0, np.int64), np.empty(0, np.float32)
        self._holds = NO_FLAGS

    def close(self) -> None:
        self._one.close()

    # -- which rows ---------------------------------------------------------------------

    def decides(self, request: Request, branches: list[Branch], first: bool = False) -> bool:
        """Whether the candidates can serve every branch sampling from one row of the
        request (`first`: the prompt's last row, where distinct openings read more)."""
        if not self._serves(request):
            return False
        if first and request.params.distinct_openings and len(branches) > 1:
            return False
        return all(self._decided(branch) for branch in branches)

    @staticmethod
    def _serves(request: Request) -> bool:
        """Whether the request's rows may be candidates at all: it reads no logprobs and
        takes nothing back."""
        return not (request.scores_tokens or request.params.bans_text)

    def _decided(self, branch: Branch) -> bool:
        """Whether the branch's chain picks from the device's cut alone."""
        device_k = branch.sampler.device_k if branch.sampler is not None else None
        return device_k is not None and device_k < self.k

    def prefers_chain(self, request: Request) -> bool:
        """Whether the request's rows would be read as candidates on chained ids."""
        return not request.prompt_logprobs and self.decides(request, request.branches, True)

    def plan(self, call: DecodeCall, batch: Batch, chunk_rows: list[int]) -> CallRows:
        """Which rows of the call, as `batch` holds them, are read as candidates; with the
        scratch token added to `batch` when the others need their whole rows copied."""
        rows = CallRows(chunk_rows, whole=False)
        needs_whole = False
        served: dict[int, bool] = {}  # _serves by id(request): once per request, not row
        for i, (request, branch) in enumerate(call.decode):
            ok = served.get(id(request))
            if ok is None:
                ok = served[id(request)] = self._serves(request)
            if branch.seq_id >= self.chained:
                rows.whole = True
            elif ok and self._decided(branch):
                tokens = branch.tokens
                token = tokens[-1] if tokens else request.prompt[-1]
                pos = request.prompt_len + len(tokens) - 1
                rows.device[i] = Origin(branch.seq_id, token, pos)
            else:
                needs_whole = True
        for chunk, last in zip(call.prefill, chunk_rows, strict=True):
            request = chunk.request
            if last < 0:
                continue
            seq_id = request.primary.seq_id
            if seq_id >= self.chained:
                rows.whole = True
            elif chunk.completes_prompt and self.decides(request, request.live, first=True):
                rows.device[last] = Origin(seq_id, request.prompt[-1], request.prompt_len - 1)
            else:
                needs_whole = True
        if needs_whole and not rows.whole:
            batch.add(self.bos, 0, self.scratch, True)
            rows.whole = rows.scratch = True
        return rows

    def read(self, rows: CallRows) -> None:
        """After the decode: drop the scratch token's cell, and copy out the candidates of
        the rows read as such (before a row decoded again overwrites them)."""
        if rows.scratch:
            self.ctx.seq_rm(self.scratch)
        if not rows.device:
            return
        at = list(rows.device)  # ascending: the decode rows, then the prompts' last
        # the call's rows ordered, and checked for end of generation, at once, read where
        # llama.cpp left them into the stage's buffers (numpy's gather and allocations
        # cost as much as the sort, right after a decode)
        ids, logits, count = self.ctx.candidate_buffers(at, self.k)
        rows.ids, rows.values, rows.holds_eog = out = self._buffers(len(at), count)
        _rows.sort_candidates(ids, logits, ids.shape[1], at, count, self._eog, *out)
        rows.slots = {i: slot for slot, i in enumerate(at)}
        self.stats.device_rows += len(at)

    def _buffers(
        self, m: int, k: int
    ) -> tuple[Ids, npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Room for m rows of k sorted candidates, kept from call to call: a call's rows
        are read before the next call's are (Engine._run)."""
        if len(self._holds) < m:
            self._ids = np.empty(m * self.k, np.int64)
            self._values = np.empty(m * self.k, np.float32)
            self._holds = np.empty(m, np.bool_)
        n = m * k  # rows of k, contiguous
        return self._ids[:n].reshape(m, k), self._values[:n].reshape(m, k), self._holds[:m]

    def row(self, rows: CallRows, i: int) -> DeviceRow | None:
        """Row i's candidates, when it was read as such."""
        slot = rows.slots.get(i)
        if slot is None:
            return None
        eog = bool(rows.holds_eog[slot])
        return DeviceRow(rows.ids[slot], rows.values[slot], self.complete, ordered=True, eog=eog)

    def pick(self, call: DecodeCall, rows: CallRows) -> dict[int, int]:
        """The tokens of the call's branches whose chains pick from the candidates alone
        (no writer's tokens waiting: live branching's `append`), made in one C loop and
        accepted, by id(branch); the branches of a prompt's last row all pick from it. A
        pick the candidates cannot prove is left out (its branch samples from the
        DeviceRow, which says so, and reads the whole row)."""
        work: list[tuple[int, bool, DevicePick]] = []
        branches: list[Branch] = []

        def add(request: Request, branch: Branch, slot: int) -> None:
            spec = branch.sampler.device_pick if branch.sampler is not None else None
            if spec is not None and not branch.forced and request.params.max_tokens:
                work.append((slot, request.masks_end(branch), spec))
                branches.append(branch)

        for i, (request, branch) in enumerate(call.decode):
            slot = rows.slots.get(i)
            if slot is not None:
                add(request, branch, slot)
        for chunk, last in zip(call.prefill, rows.chunk_rows, strict=True):
            slot = rows.slots.get(last)
            if slot is not None and chunk.completes_prompt:
                for branch in chunk.request.live:
                    add(chunk.request, branch, slot)
        if not work:
            return {}
        tokens = _rows.pick_candidates(
            rows.ids,
            rows.values,
            rows.ids.shape[1],
            rows.holds_eog,
            self._eog,
            self.complete,
            SAMPLER_APPLY,
            SAMPLER_ACCEPT,
            work,
        )
        picked: dict[int, int] = {}
        for branch, token in zip(branches, tokens, strict=True):
            if token is not None:
                picked[id(branch)] = token
                branch.sampler.picked_on_device()  # type: ignore[union-attr]
        return picked

    def whole_row(
        self, rows: CallRows, logits: npt.NDArray[np.float32], i: int
    ) -> npt.NDArray[np.float32]:
        """Row i whole, for a pick its candidates could not prove: the call's copy, else
        decoded again on the scratch sequence (kept for the row's other branches)."""
        self.stats.device_undecided += 1
        if rows.whole:
            return logits[i]
        again = rows.decoded_again.get(i)
        if again is None:
            again = rows.decoded_again[i] = self._decode_again(rows.device[i])
        return again

    def _decode_again(self, origin: Origin) -> npt.NDArray[np.float32]:
        """The row of `origin` computed again on the scratch sequence, which carries no
        chain: its cells before the position forked from the sequence's, then dropped."""
        ctx, scratch, batch = self.ctx, self.scratch, self._one
        ctx.seq_cp(origin.seq_id, scratch, 0, origin.pos)
        try:
            batch.clear()
            batch.add(origin.token, origin.pos, scratch, True)
            started = time.perf_counter()
            ctx.decode(batch)
            self.stats.decode_seconds += time.perf_counter() - started
            self.stats.device_decoded_again += 1
            return ctx.logits()[0].copy()
        finally:
            ctx.seq_rm(scratch)

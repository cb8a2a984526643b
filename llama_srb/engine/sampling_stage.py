"""The sampling stage: every branch with a row in one llama_decode call gets its next token
here, the call's rows read once, in plan order.

It takes the `DecodeCall` (engine/scheduler.py), the output row of each prompt chunk, and
the grammars' masks that the engine started while llama_decode ran (`Engine._start_masks`),
and returns what every branch it carries drew (`CallSample`: each branch's delta, whose
tokens are its new ones, and the KV changes its rewinds need), the prompt scores of
`echo` with `logprobs` written into their requests. What a branch does with its token (its
text, stop strings, banned phrases and rewinds) is the branch step's
(engine/branch_step.py); which sampler of a branch's chain runs where over a row is
sampling/chain.py's plan (docs/sampling.md has the table).

The rows are llama.cpp's logits buffer, read on the host: each row once, into its column
maxima (sampling/cut.py), just before its branches sample from it, while it is in the
core's cache for the columns they read next. A prompt's last row serves all its branches
(their first tokens). With backend sampling, the picks the device's candidates decide are
made first, for the whole call in one C loop (`DeviceCut.pick`); the branch step takes
those tokens on. Every row read is counted (`EngineStats.logits_bytes_read`, on
/metrics): what the host reads of llama.cpp's output per branch-step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from llama_srb.engine.branch_step import BranchStep, scores_of
from llama_srb.engine.context import DecodeContext
from llama_srb.engine.device_cut import CallRows, DeviceCut
from llama_srb.engine.kv import KvOp
from llama_srb.engine.outputs import ChoiceDelta
from llama_srb.engine.request import Branch, Request
from llama_srb.engine.scheduler import DecodeCall, PrefillChunk
from llama_srb.engine.stats import EngineStats
from llama_srb.sampling.cut import Row
from llama_srb.sampling.device_row import DeviceRow, Undecided
from llama_srb.sampling.logprobs import RowScores
from llama_srb.sampling.masks import Bitmask

log = logging.getLogger(__name__)


@dataclass
class CallSample:
    """What one call's branches drew. `deltas`: one per branch that sampled, in plan
    order (the branches of each prompt that ended in this call first, then the decode
    rows); a delta's `token_ids` are the tokens its text let out. `drawn`: the token each
    branch kept this step, by id(branch) (none for a branch that ended, or that a rewind
    took back to a token it decodes again first). `rewinds`: the KV changes the branches'
    rewinds need, in order. `broken`: the requests whose grammar went past a limit of its
    work per token (none of their branches sampled), with the error to end them with.
    `failed`: the requests one of whose branches could not sample (an error of the
    server's, which ends that request alone), by id(request), with theirs."""

    deltas: list[tuple[Request, ChoiceDelta]] = field(default_factory=list)
    rewinds: list[KvOp] = field(default_factory=list)
    broken: list[tuple[Request, str]] = field(default_factory=list)
    drawn: dict[int, int] = field(default_factory=dict)
    failed: dict[int, tuple[Request, str]] = field(default_factory=dict)

    def fail(self, request: Request, error: str) -> None:
        """The request ends with `error`: what its branches drew this call goes."""
        self.failed[id(request)] = (request, error)
        self.deltas = [(r, delta) for r, delta in self.deltas if r is not request]


class SamplingStage:
    """`ctx`: the context whose logits the rows are. `step`: the branch step that takes each
    branch's token on (text, stops, rewinds). `stats`: the engine's counters (the logits
    bytes the host reads, the prompt tokens forked). `device`: backend sampling's cut,
    when it is on (engine/device_cut.py)."""

    def __init__(
        self,
        ctx: DecodeContext,
        step: BranchStep,
        stats: EngineStats,
        device: DeviceCut | None = None,
    ) -> None:
        self.ctx = ctx
        self.step = step
        self.stats = stats
        self.device = device

    def run(self, call: DecodeCall, rows: CallRows, masks: dict[int, Bitmask]) -> CallSample:
        """Every branch with logits in this call samples its next token (`rows`: what the
        call's output rows hold, as `Engine._decode` asked for them; `masks`: the next
        tokens each constrained branch may take, by id(branch))."""
        out = CallSample()
        logits = self.ctx.logits()
        if not len(logits):
            return out
        chunk_rows = rows.chunk_rows
        broken = self._broken(call, masks)
        out.broken = list(broken.values())
        # the branches whose chains the candidates decide: picked in one C loop
        picked = self.device.pick(call, rows) if self.device is not None else {}
        for chunk, last in zip(call.prefill, chunk_rows, strict=True):
            if chunk.request.prompt_logprobs:
                self._score_prompt(chunk, logits, last)
        for chunk, last in zip(call.prefill, chunk_rows, strict=True):
            request = chunk.request
            if not chunk.completes_prompt or id(request) in broken:
                continue
            # every branch samples its first token from the prompt's last row
            self.stats.prompt_tokens_cached += request.n_cached
            row = self._row(rows, logits, last)
            if len(request.branches) > 1:
                row.read_maxima()  # once for them all, not once per branch's patch
            self.step.fork(request, row)
            scores = scores_of(request, row)
            # distinct_openings: each branch's first token is one no earlier one drew
            taken: set[int] | None = set() if request.params.distinct_openings else None
            for branch in request.live:
                where = (rows, logits, last)
                token = picked.get(id(branch))
                self._next(out, request, branch, row, scores, taken, masks, where, token)
        for i, (request, branch) in enumerate(call.decode):
            if id(request) in broken:
                continue
            token = picked.get(id(branch))
            if token is None:
                row = self._row(rows, logits, i)
                scores = scores_of(request, row)
                self._next(out, request, branch, row, scores, None, masks, (rows, logits, i), None)
            else:  # drawn from its candidates already: only counted
                self.stats.logits_bytes_read += rows.candidate_bytes
                self._next(out, request, branch, None, None, None, masks, (rows, logits, i), token)
        return out

    def _row(self, rows: CallRows, logits: npt.NDArray[np.float32], i: int) -> Row | DeviceRow:
        """Output row i of the call, as the host reads it (counted): the device's
        candidates, or the whole row."""
        candidates = self.device.row(rows, i) if self.device is not None else None
        if candidates is not None:
            self.stats.logits_bytes_read += candidates.nbytes
            return candidates
        return self._whole(logits[i])

    def _whole(self, logits: npt.NDArray[np.float32]) -> Row:
        """A whole row, as the host reads it: counted."""
        self.stats.logits_bytes_read += logits.nbytes
        return Row(logits)

    def _next(
        self,
        out: CallSample,
        request: Request,
        branch: Branch,
        row: Row | DeviceRow | None,
        scores: RowScores | None,
        taken: set[int] | None,
        masks: dict[int, Bitmask],
        where: tuple[CallRows, npt.NDArray[np.float32], int],
        picked: int | None,
    ) -> None:
        """`where`: the call's rows, its logits and the row's index, for a pick the
        device's candidates cannot prove (it reads the whole row then). `picked`: the
        branch's token, drawn from its candidates in DeviceCut.pick's C loop. A branch
        that cannot sample (a bug, a row of NaN) ends its request, not the others."""
        if id(request) in out.failed:
            return
        mask = masks.get(id(branch))
        try:
            try:
                delta, ops = self.step.next(request, branch, row, scores, taken, mask, picked)
            except Undecided:
                assert self.device is not None
                whole = self._whole(self.device.whole_row(*where))
                delta, ops = self.step.next(request, branch, whole, scores, taken, mask)
        except Exception as exc:
            log.exception("request %s: sampling failed", request.request_id)
            out.fail(request, f"sampling failed: {type(exc).__name__}: {exc}")
            return
        out.deltas.append((request, delta))
        out.rewinds.extend(ops)
        if delta.newest_has_no_cell:  # it kept a token, decoded in the next call
            out.drawn[id(branch)] = branch.tokens[-1]

    @staticmethod
    def _broken(call: DecodeCall, masks: dict[int, Bitmask]) -> dict[int, tuple[Request, str]]:
        """The requests one of whose branches' grammar went past a limit just now."""
        broken: dict[int, tuple[Request, str]] = {}
        if not masks:  # no grammar ran
            return broken
        for request in call.requests:
            for branch in request.live:
                matcher = branch.sampler.matcher if branch.sampler is not None else None
                if id(branch) in masks and matcher is not None and matcher.error:
                    broken[id(request)] = (request, f"the grammar cannot go on: {matcher.error}")
        return broken

    def _score_prompt(
        self, chunk: PrefillChunk, logits: npt.NDArray[np.float32], last: int
    ) -> None:
        """echo + logprobs: score each prompt token from the logits of the one before it."""
        request = chunk.request
        scores = request.prompt_scores
        # Position 0 has nothing before it; positions shared from another sequence were
        # not computed here, so they have no logits either.
        scores.extend([None] * (chunk.start + 1 - len(scores)))
        first = last - (chunk.end - chunk.start - 1)  # the output row of chunk.start
        k = request.params.logprobs or 0
        for pos in range(chunk.start + 1, min(chunk.end + 1, request.prompt_len)):
            row = self._whole(logits[first + pos - 1 - chunk.start])
            scores.append(RowScores(row, k).entry(request.prompt[pos]))

"""The engine: one step = schedule → decode → sample → postprocess, returning its outputs.

Single-threaded by design: only the engine thread (runtime.py) calls into it. Every call
that can end a request (`step`, `add`, `abort`, `fail`, `fail_all`) returns the outputs it
produced; the runtime delivers them to their readers.
"""

from __future__ import annotations

import enum
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from llama_srb.engine.best_of import BestOf
from llama_srb.engine.context import DecodeContext, Vocabulary
from llama_srb.engine.histogram import GAP_BUCKETS, WAIT_BUCKETS, Histogram
from llama_srb.engine.kv import KvBudget, KvOp
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput
from llama_srb.engine.pacing import StepPacer
from llama_srb.engine.scheduler import PrefillChunk, Scheduler, StepPlan
from llama_srb.engine.sequence import FinishReason, Request, RequestStatus, Sequence
from llama_srb.native import Batch, DecodeError, Model
from llama_srb.sampling.banned import Bans
from llama_srb.sampling.branch import build_samplers
from llama_srb.sampling.grammar import GRAMMAR_COMPLETE
from llama_srb.sampling.logprobs import RowScores, score_token
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.text import TextStream

log = logging.getLogger(__name__)


class Rewind(enum.Enum):
    """What a branch does after a banned phrase took it back (Engine._rewind)."""

    NOW = "now"  # draw again from this step's row
    FIRST = "first"  # back to its start: draw again from the prompt's last row, kept
    LATER = "later"  # its last kept token is decoded again first
    END = "end"  # a bound was reached: it ends before the phrase


@dataclass
class EngineStats:
    """Monotonic counters, read by /metrics and by tests (plain ints: no hot-path cost)."""

    steps: int = 0
    prompt_tokens_evaluated: int = 0  # prompt tokens actually run through llama_decode
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    prompt_tokens_cached: int = 0  # prompt tokens forked from cached or live sequences
    decode_step_seconds: Histogram = field(default_factory=Histogram)  # per llama_decode
    # Per stream: from one output with tokens to its next (what a reader feels as a stall).
    token_gap_seconds: Histogram = field(default_factory=lambda: Histogram(GAP_BUCKETS))
    # From arrival to admission (a seq id and cells granted), per request.
    queue_wait_seconds: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    # Steps whose head-of-queue request waited, by what it lacked.
    steps_short_of_sequences: int = 0
    steps_short_of_cells: int = 0

    def copy(self) -> EngineStats:
        """A copy whose histograms the engine thread will not change."""
        return replace(
            self,
            decode_step_seconds=self.decode_step_seconds.copy(),
            token_gap_seconds=self.token_gap_seconds.copy(),
            queue_wait_seconds=self.queue_wait_seconds.copy(),
        )


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's counters and gauges as of its last step. The engine thread publishes a
    new one after every step; other threads (/metrics) read only these, never the live
    bookkeeping, which the engine thread changes (and memoizes) as it goes."""

    stats: EngineStats = field(default_factory=EngineStats)
    requests_running: int = 0
    requests_waiting: int = 0
    sequences_running: int = 0
    kv_cells_reserved: int = 0
    kv_cells_used: int = 0
    kv_cells_cached: int = 0
    kv_cells_total: int = 0


class Engine:
    def __init__(
        self,
        model: Vocabulary,
        ctx: DecodeContext,
        budget: KvBudget,
        step_budget: float = 0.0,
        tokens_per_call: int = 0,
    ) -> None:
        """`step_budget`: seconds a step may take while streams decode (0: no limit).
        `tokens_per_call`: the most tokens one llama_decode call carries; a step with
        more makes several calls (0: one call per step)."""
        self.model = model
        self.ctx = ctx
        self.tokens_per_call = tokens_per_call
        self.pacer = StepPacer(step_budget)
        self.scheduler = Scheduler(budget, ctx.n_batch, self.pacer)
        self.batch = Batch(ctx.n_batch)
        self.stats = EngineStats()
        self.snapshot = EngineSnapshot(kv_cells_total=budget.n_cells)
        self._eog = np.array(model.eog_tokens, dtype=np.int64)
        self._eog_set = frozenset(model.eog_tokens)  # per-token check without a C call
        self._last_output_at: dict[str, float] = {}  # request id -> its last tokens' time

    def close(self) -> None:
        self.batch.close()

    def warm_up(self) -> None:
        # Any valid token serves; a model without a BOS token reports -1, which would abort.
        self.ctx.warm_up(self.model.bos if self.model.bos >= 0 else 0)

    @property
    def has_work(self) -> bool:
        """Whether `step` would decode anything now (else wait for a submission)."""
        return self.scheduler.has_work

    # -- submissions and endings (on the engine thread); each returns its outputs ------

    def add(self, request: Request) -> list[RequestOutput]:
        if not self.scheduler.budget.fits_ever(request):
            # The API refuses these up front; this guards direct engine users.
            message = f"needs {request.cells_needed} KV cells, {self.ctx.n_ctx} exist"
            return self.fail([request], message)
        self.scheduler.add(request)
        return []

    def abort(self, request_id: str) -> list[RequestOutput]:
        """The reader is gone (or out of time): end the request before the next step."""
        request = self.scheduler.find(request_id)
        return [] if request is None else self._end_requests([request], FinishReason.ABORT)

    def fail(self, requests: Iterable[Request], message: str) -> list[RequestOutput]:
        """End requests with an error: theirs, or the engine's."""
        return self._end_requests(requests, FinishReason.ERROR, message)

    def fail_all(self, message: str) -> list[RequestOutput]:
        """After an unexpected engine error or at shutdown: end everything in flight."""
        return self.fail(self.scheduler.requests, message)

    # -- the step ----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one decode step and return the outputs it produced (often none: a step
        that only prefills, or one with nothing to do)."""
        plan = self.scheduler.schedule()
        self._observe_admission(plan)
        self._apply(plan.kv_ops)
        outputs: list[RequestOutput] = []
        if not plan.empty:
            try:
                outputs = self._run(plan)
            except Exception as exc:  # keep serving: fail what was in flight, not the server
                log.exception("engine step failed")
                outputs += self.fail_all(f"engine error: {exc}")
        self.publish_snapshot()
        return outputs

    def _run(self, plan: StepPlan) -> list[RequestOutput]:
        """Decode the plan's calls, each sampled before the next overwrites its logits;
        then what was sampled ends branches and requests, or goes out."""
        failed: list[RequestOutput] = []
        progress: list[RequestOutput] = []
        sampled: dict[int, tuple[Request, list[ChoiceDelta]]] = {}
        seconds = 0.0
        for call in plan.calls(self.tokens_per_call):
            try:
                seconds += self._decode(call)
            except DecodeError as exc:  # this call failed: its requests end, others go on
                failed += self.fail(call.requests, str(exc))
                continue
            self._apply(self.scheduler.prefilled(call))
            self._sample(call, sampled)
            progress += [_progress(c) for c in call.prefill if not c.completes_prompt]
        self.stats.steps += 1
        n_prefill = plan.n_tokens - len(plan.decode)
        self.pacer.observe(len(plan.decode), n_prefill, seconds)
        steps = list(sampled.values())
        ops = self.scheduler.postprocess(steps)
        outputs = [self._output(request, choices) for request, choices in steps]
        self._apply(ops)
        self._observe_gaps(outputs)
        return failed + progress + outputs

    def publish_snapshot(self) -> None:
        """Replace `snapshot` (one reference assignment: readers see old or new, whole)."""
        scheduler, budget = self.scheduler, self.scheduler.budget
        self.snapshot = EngineSnapshot(
            stats=self.stats.copy(),
            requests_running=len(scheduler.running),
            requests_waiting=len(scheduler.waiting),
            sequences_running=budget.live,
            kv_cells_reserved=budget.cells_reserved,
            kv_cells_used=budget.cells_used,
            kv_cells_cached=budget.cache.cells(),
            kv_cells_total=budget.n_cells,
        )

    def _decode(self, plan: StepPlan) -> float:
        """One llama_decode call; returns its seconds."""
        batch = self.batch
        batch.clear()
        for request, seq in plan.decode:
            seq.batch_index = batch.add(seq.tokens[-1], self._pos(request, seq), seq.seq_id, True)
        for chunk in plan.prefill:
            request = chunk.request
            tokens = request.prompt[chunk.start : chunk.end]
            last = batch.add_span(
                tokens,
                chunk.start,
                request.primary.seq_id,
                chunk.completes_prompt,
                logits_all=request.prompt_logprobs,
            )
            request.batch_index = last
        started = time.perf_counter()
        self.ctx.decode(batch)
        elapsed = time.perf_counter() - started
        self.stats.decode_seconds += elapsed
        self.stats.decode_step_seconds.observe(elapsed)
        self.stats.prompt_tokens_evaluated += plan.n_tokens - len(plan.decode)
        return elapsed

    def _observe_admission(self, plan: StepPlan) -> None:
        now = time.monotonic()
        for request in plan.admitted:
            self.stats.queue_wait_seconds.observe(now - request.arrival)
        if plan.blocked == "sequences":
            self.stats.steps_short_of_sequences += 1
        elif plan.blocked == "cells":
            self.stats.steps_short_of_cells += 1

    def _observe_gaps(self, outputs: list[RequestOutput]) -> None:
        """Time between consecutive outputs with tokens, per request: its stream's gaps."""
        now = time.monotonic()
        for output in outputs:
            if any(c.token_ids for c in output.choices):
                last = self._last_output_at.get(output.request_id)
                if last is not None:
                    self.stats.token_gap_seconds.observe(now - last)
                self._last_output_at[output.request_id] = now
            if output.finished:
                self._last_output_at.pop(output.request_id, None)

    def _sample(
        self, plan: StepPlan, sampled: dict[int, tuple[Request, list[ChoiceDelta]]]
    ) -> None:
        """Every branch with logits in this call samples its next token; per request, in
        plan order, the deltas of its branches join `sampled`."""

        def deltas(request: Request) -> list[ChoiceDelta]:
            return sampled.setdefault(id(request), (request, []))[1]

        for chunk in plan.prefill:
            request = chunk.request
            if request.prompt_logprobs:
                self._score_prompt(chunk)
            if chunk.completes_prompt:  # forked: every branch samples from the last row
                self.stats.prompt_tokens_cached += request.n_cached
                out = deltas(request)
                # distinct_openings: each branch's first token is one no earlier one drew
                taken: set[int] | None = set() if request.params.distinct_openings else None
                if request.params.banned_strings:  # kept for rewinds to a branch's start
                    request.first_row = self.ctx.logits(request.batch_index).copy()
                for seq in request.sequences:
                    seq.batch_index = request.batch_index
                    out.append(self._sample_branch(request, seq, taken))
        for request, seq in plan.decode:
            deltas(request).append(self._sample_branch(request, seq))

    def _score_prompt(self, chunk: PrefillChunk) -> None:
        """echo + logprobs: score each prompt token from the logits of the one before it."""
        request = chunk.request
        scores = request.prompt_scores
        # Position 0 has nothing before it; positions shared from another sequence were
        # not computed here, so they have no logits either.
        scores.extend([None] * (chunk.start + 1 - len(scores)))
        first = request.batch_index - (chunk.end - chunk.start - 1)  # batch index of chunk.start
        k = request.params.logprobs or 0
        for pos in range(chunk.start + 1, min(chunk.end + 1, request.prompt_len)):
            row = self.ctx.logits(first + pos - 1 - chunk.start)
            scores.append(score_token(row, request.prompt[pos], k))

    def _sample_branch(
        self, request: Request, seq: Sequence, taken: set[int] | None = None
    ) -> ChoiceDelta:
        """The branch's delta for this step, with its tokens' logprobs when asked for."""
        if not request.scores_tokens:  # the common case: no numpy over the logits row
            return self._next_delta(request, seq, None, taken)
        # Read before _next_delta masks the row: logprobs are of the model's distribution.
        scores = RowScores(self.ctx.logits(seq.batch_index), request.params.logprobs or 0)
        return self._next_delta(request, seq, scores, taken)

    def _next_delta(
        self, request: Request, seq: Sequence, scores: RowScores | None, taken: set[int] | None
    ) -> ChoiceDelta:
        """Sample the next token and turn it into text; a finish reason when the branch
        ends here (the scheduler then releases it). A token that began a banned phrase
        is taken back (`_rewind`), and drawn again from the same row when it can be."""
        params = request.params
        assert seq.sampler is not None and seq.decoder is not None
        released = seq.decoder.released
        if params.max_tokens == 0:
            return self._last_delta(request, seq, released, FinishReason.LENGTH)
        if params.ignore_eos or len(seq.tokens) < params.min_tokens:
            self.ctx.logits(seq.batch_index)[self._eog] = -np.inf
        row = None  # this step's row; after a rewind to the start, the prompt's last one
        while True:
            token = self._pick(seq, taken, row)
            if token == GRAMMAR_COMPLETE:  # nothing may follow: the branch has said it all
                return self._last_delta(request, seq, released, FinishReason.STOP)
            self.stats.generated_tokens += 1
            if token in self._eog_set:
                return self._last_delta(request, seq, released, FinishReason.STOP)
            seq.tokens.append(token)
            if scores is not None:
                seq.scores.append(scores.entry(token))
            text = seq.decoder.push(token, check_stops=len(seq.tokens) > params.min_tokens)
            if seq.decoder.banned_at is None:
                break
            rewind = self._rewind(request, seq)
            if rewind is Rewind.END:
                return self._last_delta(request, seq, released, FinishReason.STOP)
            if rewind is Rewind.LATER:
                return ChoiceDelta(seq.index)
            if rewind is Rewind.FIRST:
                row, scores = self._first_row(request, scores is not None)
        if seq.decoder.stopped:
            return self._last_delta(request, seq, released, FinishReason.STOP, text, 1)
        if len(seq.tokens) >= params.max_tokens:
            return self._last_delta(request, seq, released, FinishReason.LENGTH, text, 1)
        return self._delta(request, seq, released, text, None, 1)

    def _pick(
        self, seq: Sequence, taken: set[int] | None, row: npt.NDArray[np.float32] | None
    ) -> int:
        """The branch's sampler's token from this step's row (or `row`), never one banned
        at this position (nor, for a distinct opening, one in `taken`, which it joins)."""
        assert seq.sampler is not None
        banned = seq.bans.at(len(seq.tokens)) if seq.bans is not None else None
        if banned is None and taken is None and row is None:
            return seq.sampler.sample(self.ctx.ptr, seq.batch_index)
        own_row = row is not None
        row = self.ctx.logits(seq.batch_index) if row is None else row
        saved = row[banned].copy() if banned else None
        if banned:
            row[banned] = -np.inf
        try:
            if taken is None and not own_row:
                return seq.sampler.sample(self.ctx.ptr, seq.batch_index)
            token = seq.sampler.opening(row, set() if taken is None else taken)
            if taken is not None:
                taken.add(token)
            return token
        finally:
            if banned:  # the row may be every branch's (the fork step): put it back
                row[banned] = saved

    def _rewind(self, request: Request, seq: Sequence) -> Rewind:
        """A banned phrase began in the branch's token k: take the branch back to before
        it, and ban that token at position k. Its KV cells from there go, its sampler
        forgets what followed; its text was held back, so no reader saw any of it."""
        assert seq.bans is not None and seq.decoder is not None and seq.sampler is not None
        k = seq.decoder.banned_at
        assert k is not None
        newest = len(seq.tokens) - 1  # sampled this step: it has no cell yet
        going = seq.bans.ban(k, seq.tokens[k])
        seq.decoder.rewind(k)
        del seq.tokens[k:], seq.scores[k:]
        if not going:  # bounds reached: the branch ends with the text before the phrase
            if k < newest:
                self._apply([KvOp.remove(seq.seq_id, request.prompt_len + k)])
            return Rewind.END
        seq.sampler.rewind(seq.tokens)
        if k == newest:  # this step's row is position k's: draw again from it
            return Rewind.NOW
        if k == 0:  # the prompt's last row was kept (request.first_row): draw from it
            self._apply([KvOp.remove(seq.seq_id, request.prompt_len)])
            return Rewind.FIRST
        # Position k's row is gone: the token before it is decoded again next step.
        self._apply([KvOp.remove(seq.seq_id, request.prompt_len + k - 1)])
        return Rewind.LATER

    def _first_row(
        self, request: Request, scored: bool
    ) -> tuple[npt.NDArray[np.float32], RowScores | None]:
        """A copy of the prompt's last row to sample a branch's first token from again,
        masked as the fork step masked it; and its scores, when the request wants them."""
        assert request.first_row is not None
        row = request.first_row.copy()
        scores = RowScores(row, request.params.logprobs or 0) if scored else None
        if request.params.ignore_eos or request.params.min_tokens > 0:
            row[self._eog] = -np.inf
        return row, scores

    def _delta(
        self,
        request: Request,
        seq: Sequence,
        released: int,
        text: str,
        reason: FinishReason | None = None,
        undecoded: int = 0,
    ) -> ChoiceDelta:
        """The branch's delta: the tokens its text stream let out since `released` (the
        count before this step), with their logprobs when the request asked."""
        assert seq.decoder is not None
        end = seq.decoder.released
        tokens = seq.tokens[released:end]
        logprobs = (
            seq.scores[released:end] if tokens and request.params.logprobs is not None else None
        )
        return ChoiceDelta(seq.index, text, tokens, reason, logprobs, undecoded)

    def _last_delta(
        self,
        request: Request,
        seq: Sequence,
        released: int,
        reason: FinishReason,
        text: str = "",
        undecoded: int = 0,
    ) -> ChoiceDelta:
        """A branch's last delta, with the text it held back for a stop string or a
        banned phrase that never came."""
        assert seq.decoder is not None
        text += seq.decoder.flush()
        return self._delta(request, seq, released, text, reason, undecoded)

    # -- outputs -----------------------------------------------------------------------

    def _end_requests(
        self, requests: Iterable[Request], reason: FinishReason, error: str | None = None
    ) -> list[RequestOutput]:
        """End every branch of each request at once (abort, failure)."""
        outputs = []
        for request in list(requests):
            self._last_output_at.pop(request.request_id, None)
            choices = [ChoiceDelta(seq.index, "", [], reason) for seq in request.live]
            self._apply(self.scheduler.end_request(request, reason, error))
            outputs.append(self._output(request, choices))
        return outputs

    @staticmethod
    def _output(request: Request, choices: list[ChoiceDelta]) -> RequestOutput:
        if request.best_of is not None:  # held until it ends, then the best n
            choices = request.best_of.collect(request, choices)
        return RequestOutput(
            request_id=request.request_id,
            choices=choices,
            prompt_tokens=request.prompt_len,
            completion_tokens=request.completion_tokens,
            cached_tokens=request.n_cached,
            finished=request.status is RequestStatus.FINISHED,
            error=request.error,
            prompt_logprobs=request.prompt_scores if request.prompt_logprobs else None,
        )

    def _apply(self, ops: list[KvOp]) -> None:
        for op in ops:
            if op.is_remove:
                self.ctx.seq_rm(op.dst, op.p0, op.p1)
            else:
                self.ctx.seq_cp(op.src, op.dst, op.p0, op.p1)

    @staticmethod
    def _pos(request: Request, seq: Sequence) -> int:
        # The newest token of a branch sits right after the prompt and its earlier tokens.
        return request.prompt_len + len(seq.tokens) - 1


def _progress(chunk: PrefillChunk) -> RequestOutput:
    """A prompt read in part: how far (the API streams it as prompt progress)."""
    request = chunk.request
    return RequestOutput(
        request.request_id,
        [],
        request.prompt_len,
        0,
        request.n_cached,
        prompt_processed=chunk.end,
    )


def build_request(
    model: Model,
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    n: int,
    prompt_logprobs: bool = False,
    best_of: int | None = None,
) -> Request:
    """A request with `n` branches (`best_of` when given: the `n` best are returned),
    each with its own sampler chain seeded `seed + index` and its `choices_params` entry.

    Safe to call off the engine thread: it only reads the model's vocabulary.
    """
    base_seed = params.seed if params.seed is not None else random.getrandbits(32)
    branches = best_of if best_of is not None and best_of > n else n
    samplers = build_samplers(model, params, [base_seed + index for index in range(branches)])
    sequences = [
        Sequence(
            index=index,
            sampler=sampler,
            decoder=TextStream(
                model.piece,
                params.stop,
                params.banned_strings,
                params.banned_strings_case_sensitive,
            ),
            bans=Bans() if params.banned_strings else None,
        )
        for index, sampler in enumerate(samplers)
    ]
    request = Request(request_id, prompt, params, sequences)
    request.prompt_logprobs = prompt_logprobs
    if branches > n:
        request.best_of = BestOf(n)
    return request

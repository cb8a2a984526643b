"""The engine: plan a step, decode it, sample every branch, publish what changed.

Single-threaded by design: only the engine thread (runtime.py) calls into it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace

import numpy as np

from llama_srb.engine.histogram import Histogram
from llama_srb.engine.kv import KvBudget, KvOp
from llama_srb.engine.native import Batch, Context, DecodeError, Model
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput
from llama_srb.engine.scheduler import PrefillChunk, Scheduler, StepPlan
from llama_srb.engine.sequence import FinishReason, Request, RequestStatus, Sequence
from llama_srb.sampling.chain import build_chains
from llama_srb.sampling.grammar import GRAMMAR_COMPLETE
from llama_srb.sampling.logprobs import RowScores, score_token
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.text import TextStream


@dataclass
class EngineStats:
    """Monotonic counters, read by /metrics and by tests (plain ints: no hot-path cost)."""

    steps: int = 0
    prompt_tokens_evaluated: int = 0  # prompt tokens actually run through llama_decode
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    prompt_tokens_cached: int = 0  # prompt tokens forked from cached or live sequences
    decode_step_seconds: Histogram = field(default_factory=Histogram)  # per llama_decode


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
    def __init__(self, model: Model, ctx: Context, budget: KvBudget) -> None:
        self.model = model
        self.ctx = ctx
        self.scheduler = Scheduler(budget, ctx.n_batch)
        self.batch = Batch(ctx.n_batch)
        self.stats = EngineStats()
        self.snapshot = EngineSnapshot(kv_cells_total=budget.n_cells)
        self._eog = np.array(model.eog_tokens, dtype=np.int64)
        self._eog_set = frozenset(model.eog_tokens)  # per-token check without a C call

    def close(self) -> None:
        self.batch.close()

    # -- submissions (called on the engine thread) -------------------------------------

    def add(self, request: Request) -> None:
        if not self.scheduler.budget.fits_ever(request):
            # The API refuses these up front; this guards direct engine users.
            self.fail(request, f"needs {request.cells_needed} KV cells, {self.ctx.n_ctx} exist")
            return
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        request = self.scheduler.find(request_id)
        if request is not None:
            self._end(request, FinishReason.ABORT)

    # -- the step ----------------------------------------------------------------------

    def step(self) -> bool:
        """Run one decode step; False when there was nothing to do."""
        plan = self.scheduler.schedule()
        if not plan.empty:
            try:
                self._decode(plan)
            except DecodeError as exc:
                for request in {id(r): r for r in self._requests_in(plan)}.values():
                    self.fail(request, str(exc))
            else:
                self._sample(plan)
        self.publish_snapshot()
        return not plan.empty

    def publish_snapshot(self) -> None:
        """Replace `snapshot` (one reference assignment: readers see old or new, whole)."""
        scheduler, budget = self.scheduler, self.scheduler.budget
        self.snapshot = EngineSnapshot(
            stats=replace(self.stats, decode_step_seconds=self.stats.decode_step_seconds.copy()),
            requests_running=len(scheduler.running),
            requests_waiting=len(scheduler.waiting),
            sequences_running=budget.live,
            kv_cells_reserved=budget.cells_reserved,
            kv_cells_used=budget.cells_used,
            kv_cells_cached=budget.cache.cells(),
            kv_cells_total=budget.n_cells,
        )

    def _decode(self, plan: StepPlan) -> None:
        self._apply(plan.kv_ops)
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
        self.stats.steps += 1
        self.stats.prompt_tokens_evaluated += plan.n_tokens - len(plan.decode)

    def _sample(self, plan: StepPlan) -> None:
        deltas: dict[int, tuple[Request, list[ChoiceDelta]]] = {}

        def delta_list(request: Request) -> list[ChoiceDelta]:
            return deltas.setdefault(id(request), (request, []))[1]

        for chunk in plan.prefill:
            chunk.request.n_prefilled = chunk.end
            if chunk.request.prompt_logprobs:
                self._score_prompt(chunk)
            if chunk.completes_prompt:
                self._fork(chunk)
                out = delta_list(chunk.request)
                for seq in chunk.request.sequences:
                    seq.batch_index = chunk.request.batch_index
                    out.append(self._advance(chunk.request, seq))
        for request, seq in plan.decode:
            delta_list(request).append(self._advance(request, seq))
        for request, choices in deltas.values():
            self._publish(request, choices)

    def _fork(self, chunk: PrefillChunk) -> None:
        """The prompt is in the primary sequence: share its cells with every other branch."""
        request = chunk.request
        for seq in request.sequences[1:]:
            self.ctx.seq_cp(request.primary.seq_id, seq.seq_id, -1, -1)
        request.status = RequestStatus.DECODING
        request.first_token_at = time.monotonic()
        self.stats.prompt_tokens_cached += request.n_cached

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

    def _advance(self, request: Request, seq: Sequence) -> ChoiceDelta:
        """Sample the branch's next token; score it too when the request asks for logprobs."""
        k = request.params.logprobs
        if k is None:  # the common case: no numpy over the logits row
            return self._next_token(request, seq)
        # Read before _next_token masks the row: logprobs are of the model's distribution.
        scores = RowScores(self.ctx.logits(seq.batch_index), k)
        delta = self._next_token(request, seq)
        if delta.token_ids:
            delta.logprobs = [scores.entry(delta.token_ids[-1])]
        return delta

    def _next_token(self, request: Request, seq: Sequence) -> ChoiceDelta:
        """Sample the branch's next token from this step's logits and turn it into text."""
        params = request.params
        if params.max_tokens == 0:
            return self._end_sequence(request, seq, FinishReason.LENGTH)
        if params.ignore_eos or len(seq.tokens) < params.min_tokens:
            self.ctx.logits(seq.batch_index)[self._eog] = -np.inf
        assert seq.sampler is not None and seq.decoder is not None
        token = seq.sampler.sample(self.ctx.ptr, seq.batch_index)
        if token == GRAMMAR_COMPLETE:  # nothing may follow: the branch has said it all
            return self._end_sequence(request, seq, FinishReason.STOP)
        self.stats.generated_tokens += 1
        if token in self._eog_set:
            return self._end_sequence(request, seq, FinishReason.STOP)
        seq.tokens.append(token)
        text = seq.decoder.push(token, check_stops=len(seq.tokens) > params.min_tokens)
        if seq.decoder.stopped:
            return self._end_sequence(request, seq, FinishReason.STOP, text, [token])
        if len(seq.tokens) >= params.max_tokens:
            return self._end_sequence(request, seq, FinishReason.LENGTH, text, [token])
        return ChoiceDelta(seq.index, text, [token])

    def _end_sequence(
        self,
        request: Request,
        seq: Sequence,
        reason: FinishReason,
        text: str = "",
        token_ids: list[int] | None = None,
    ) -> ChoiceDelta:
        """A branch ended: release what it held and say so in its last delta."""
        if seq.decoder is not None:
            text += seq.decoder.flush()  # text held back for a stop string that never came
        if seq.sampler is not None:
            seq.sampler.close()
        seq.finish_reason = reason
        self._apply(self.scheduler.finish_sequence(request, seq, self._kv_path(request, seq)))
        return ChoiceDelta(seq.index, text, token_ids or [], reason)

    # -- endings and publishing --------------------------------------------------------

    def _publish(self, request: Request, choices: list[ChoiceDelta]) -> None:
        finished = not request.live
        if finished:
            self._apply(self.scheduler.remove(request))
            request.status = RequestStatus.FINISHED
        request.sink(self._output(request, choices, finished))

    def _end(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        """End every branch of a request at once (abort, engine failure)."""
        # An aborted request's cells are still valid and worth caching; a failed one's not.
        paths = {
            seq.seq_id: self._kv_path(request, seq)
            for seq in request.live
            if seq.seq_id >= 0 and reason is not FinishReason.ERROR
        }
        choices = []
        for seq in request.live:
            seq.finish_reason = reason
            if seq.sampler is not None:
                seq.sampler.close()
            choices.append(ChoiceDelta(seq.index, "", [], reason))
        if self._tracked(request):
            self._apply(self.scheduler.remove(request, paths))
        request.status = RequestStatus.FINISHED
        request.error = error
        request.sink(self._output(request, choices, True))

    def fail_all(self, message: str) -> None:
        """After an unexpected engine error: end everything in flight, keep serving."""
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            self.fail(request, message)

    def fail(self, request: Request, message: str) -> None:
        self._end(request, FinishReason.ERROR, message)

    def _tracked(self, request: Request) -> bool:
        return request in self.scheduler.running or request in self.scheduler.waiting

    def _output(
        self, request: Request, choices: list[ChoiceDelta], finished: bool
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            choices=choices,
            prompt_tokens=request.prompt_len,
            completion_tokens=request.completion_tokens,
            cached_tokens=request.n_cached,
            finished=finished,
            error=request.error,
            prompt_logprobs=request.prompt_scores if request.prompt_logprobs else None,
        )

    def _apply(self, ops: list[KvOp]) -> None:
        for op in ops:
            if op.is_remove:
                self.ctx.seq_rm(op.dst, op.p0, op.p1)
            else:
                self.ctx.seq_cp(op.src, op.dst, op.p0, op.p1)

    def _kv_path(self, request: Request, seq: Sequence) -> list[int] | None:
        """The tokens whose cells this branch holds (its last sampled token was never
        decoded, so it has no cell), or None if it holds none."""
        held = self.ctx.seq_pos_max(seq.seq_id) + 1
        return (request.prompt + seq.tokens)[:held] if held > 0 else None

    @staticmethod
    def _pos(request: Request, seq: Sequence) -> int:
        # The newest token of a branch sits right after the prompt and its earlier tokens.
        return request.prompt_len + len(seq.tokens) - 1

    @staticmethod
    def _requests_in(plan: StepPlan) -> list[Request]:
        return [r for r, _ in plan.decode] + [c.request for c in plan.prefill]


def build_request(
    model: Model,
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    n: int,
    prompt_logprobs: bool = False,
) -> Request:
    """A request with `n` branches, each with its own sampler chain seeded `seed + index`.

    Safe to call off the engine thread: it only reads the model's vocabulary.
    """
    base_seed = params.seed if params.seed is not None else random.getrandbits(32)
    samplers = build_chains(model, params, [base_seed + index for index in range(n)])
    sequences = [
        Sequence(index=index, sampler=sampler, decoder=TextStream(model.piece, params.stop))
        for index, sampler in enumerate(samplers)
    ]
    request = Request(request_id, prompt, params, sequences)
    request.prompt_logprobs = prompt_logprobs
    return request

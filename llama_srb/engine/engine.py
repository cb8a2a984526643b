"""The engine: one step = schedule → decode → sample → postprocess, returning its outputs.

Single-threaded by design: only the engine thread (runtime.py) calls into it. Every call
that can end a request (`step`, `add`, `abort`, `fail`, `fail_all`) returns the outputs it
produced; the runtime delivers them to their readers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from llama_srb.engine.context import DecodeContext, Vocabulary
from llama_srb.engine.histogram import Histogram
from llama_srb.engine.kv import KvBudget, KvOp
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput
from llama_srb.engine.scheduler import PrefillChunk, Scheduler, StepPlan
from llama_srb.engine.sequence import FinishReason, Request, RequestStatus, Sequence
from llama_srb.native import Batch, DecodeError, Model
from llama_srb.sampling.chain import build_chains
from llama_srb.sampling.grammar import GRAMMAR_COMPLETE
from llama_srb.sampling.logprobs import RowScores, score_token
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.text import TextStream

log = logging.getLogger(__name__)


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
    def __init__(self, model: Vocabulary, ctx: DecodeContext, budget: KvBudget) -> None:
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

    def warm_up(self) -> None:
        self.ctx.warm_up(self.model.bos)

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
        self._apply(plan.kv_ops)
        outputs: list[RequestOutput] = []
        if not plan.empty:
            try:
                self._decode(plan)
                self._apply(self.scheduler.prefilled(plan))
                sampled = self._sample(plan)
                ops = self.scheduler.postprocess(sampled)
                outputs = [self._output(request, choices) for request, choices in sampled]
                self._apply(ops)
            except DecodeError as exc:  # this batch failed: its requests end, others go on
                outputs = self.fail(plan.requests, str(exc))
            except Exception as exc:  # keep serving: fail what was in flight, not the server
                log.exception("engine step failed")
                outputs += self.fail_all(f"engine error: {exc}")
        self.publish_snapshot()
        return outputs

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

    def _sample(self, plan: StepPlan) -> list[tuple[Request, list[ChoiceDelta]]]:
        """Every branch with logits this step samples its next token; per request, in
        plan order, the deltas of its branches."""
        sampled: dict[int, tuple[Request, list[ChoiceDelta]]] = {}

        def deltas(request: Request) -> list[ChoiceDelta]:
            return sampled.setdefault(id(request), (request, []))[1]

        for chunk in plan.prefill:
            request = chunk.request
            if request.prompt_logprobs:
                self._score_prompt(chunk)
            if chunk.completes_prompt:  # forked: every branch samples from the last row
                self.stats.prompt_tokens_cached += request.n_cached
                out = deltas(request)
                for seq in request.sequences:
                    seq.batch_index = request.batch_index
                    out.append(self._sample_branch(request, seq))
        for request, seq in plan.decode:
            deltas(request).append(self._sample_branch(request, seq))
        return list(sampled.values())

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

    def _sample_branch(self, request: Request, seq: Sequence) -> ChoiceDelta:
        """The branch's delta for this step, with its token's logprob when asked for."""
        k = request.params.logprobs
        if k is None:  # the common case: no numpy over the logits row
            return self._next_delta(request, seq)
        # Read before _next_delta masks the row: logprobs are of the model's distribution.
        scores = RowScores(self.ctx.logits(seq.batch_index), k)
        delta = self._next_delta(request, seq)
        if delta.token_ids:
            delta.logprobs = [scores.entry(delta.token_ids[-1])]
        return delta

    def _next_delta(self, request: Request, seq: Sequence) -> ChoiceDelta:
        """Sample the next token and turn it into text; a finish reason when the branch
        ends here (the scheduler then releases it)."""
        params = request.params
        if params.max_tokens == 0:
            return self._last_delta(seq, FinishReason.LENGTH)
        if params.ignore_eos or len(seq.tokens) < params.min_tokens:
            self.ctx.logits(seq.batch_index)[self._eog] = -np.inf
        assert seq.sampler is not None and seq.decoder is not None
        token = seq.sampler.sample(self.ctx.ptr, seq.batch_index)
        if token == GRAMMAR_COMPLETE:  # nothing may follow: the branch has said it all
            return self._last_delta(seq, FinishReason.STOP)
        self.stats.generated_tokens += 1
        if token in self._eog_set:
            return self._last_delta(seq, FinishReason.STOP)
        seq.tokens.append(token)
        text = seq.decoder.push(token, check_stops=len(seq.tokens) > params.min_tokens)
        if seq.decoder.stopped:
            return self._last_delta(seq, FinishReason.STOP, text, token)
        if len(seq.tokens) >= params.max_tokens:
            return self._last_delta(seq, FinishReason.LENGTH, text, token)
        return ChoiceDelta(seq.index, text, [token])

    @staticmethod
    def _last_delta(
        seq: Sequence, reason: FinishReason, text: str = "", token: int | None = None
    ) -> ChoiceDelta:
        """A branch's last delta, with the text it held back for a stop string that
        never came."""
        if seq.decoder is not None:
            text += seq.decoder.flush()
        return ChoiceDelta(seq.index, text, [] if token is None else [token], reason)

    # -- outputs -----------------------------------------------------------------------

    def _end_requests(
        self, requests: Iterable[Request], reason: FinishReason, error: str | None = None
    ) -> list[RequestOutput]:
        """End every branch of each request at once (abort, failure)."""
        outputs = []
        for request in list(requests):
            choices = [ChoiceDelta(seq.index, "", [], reason) for seq in request.live]
            self._apply(self.scheduler.end_request(request, reason, error))
            outputs.append(self._output(request, choices))
        return outputs

    @staticmethod
    def _output(request: Request, choices: list[ChoiceDelta]) -> RequestOutput:
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

"""The engine: one step = schedule → decode → sample → postprocess, returning its outputs.

Single-threaded by design: only the engine thread (runtime.py) calls into it. Every call
that can end a request (`step`, `add`, `abort`, `fail`, `fail_all`) returns the outputs it
produced; the runtime delivers them to their readers. Who writes what: the scheduler every
status and KV grant (engine/scheduler.py), the branch step every branch's tokens and text
(engine/branch_step.py), called by the sampling stage that reads each call's rows
(engine/sampling_stage.py), this module the counters; every change to llama.cpp's KV cache
comes back from them as KvOps, applied here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from llama_srb.engine.branch_step import BranchStep
from llama_srb.engine.context import DecodeContext, Vocabulary
from llama_srb.engine.device_cut import CallRows, DeviceCut
from llama_srb.engine.kv import KvBudget, KvOp, KvRestore, KvSave, Shortage
from llama_srb.engine.outputs import ChoiceDelta, FinishReason, LiveRefused, RequestOutput
from llama_srb.engine.pacing import StepPacer
from llama_srb.engine.request import Branch, Request, RequestStatus, Sampler
from llama_srb.engine.sampling_stage import SamplingStage
from llama_srb.engine.scheduler import DecodeCall, PrefillChunk, Scheduler, StepPlan
from llama_srb.engine.share import ShareRules
from llama_srb.engine.stats import EngineSnapshot, EngineStats
from llama_srb.engine.tier_io import TierIO
from llama_srb.engine.watch import StepWatch
from llama_srb.native import Batch, DecodeError
from llama_srb.sampling.masks import Bitmask, MaskBatch

log = logging.getLogger(__name__)

Sampled = dict[int, tuple[Request, list[ChoiceDelta]]]  # by id(request), in plan order
# Mid-stream, /metrics' snapshot is renewed at most this often: a copy of the counters
# costs as much as a tenth of a one-branch step. A step that admits or ends a request, finds
# another one queued, or leaves nothing running, publishes at once.
SNAPSHOT_SECONDS = 0.05
# A call without constrained rows: no masks, and no future made for them on every step.
NO_MASKS: Future[dict[int, Bitmask]] = Future()
NO_MASKS.set_result({})


class Engine:
    def __init__(
        self,
        model: Vocabulary,
        ctx: DecodeContext,
        budget: KvBudget,
        step_budget: float = 0.0,
        tokens_per_call: int = 0,
        share: ShareRules | None = None,
        device_top_k: int = 0,
        chained: int = 0,
    ) -> None:
        """`step_budget`: seconds a step may take while streams decode (0: no limit).
        `tokens_per_call`: the most tokens one llama_decode call carries; a step with
        more makes several calls (0: one call per step). `share`: fair share between
        clients (engine/share.py). `device_top_k`, `chained`: backend sampling's cut, on
        the context's sequence ids below `chained` (engine/device_cut.py; 0: off); the
        context has one id more than the budget's, its scratch sequence."""
        self.model = model
        self.ctx = ctx
        on_device = device_top_k > 0 and chained > 0
        # with backend sampling a call may carry one token more (engine/device_cut.py)
        self.tokens_per_call = max(tokens_per_call - on_device, 0)
        self.pacer = StepPacer(step_budget)
        self.scheduler = Scheduler(budget, ctx.n_batch - on_device, self.pacer, share)
        self.watch = StepWatch()  # what runs now, for the watchdog on the event loop
        self.batch = Batch(ctx.n_batch)
        self.stats = EngineStats()
        self.snapshot = EngineSnapshot(kv_cells_total=budget.n_cells)
        self._published_at = -math.inf  # time.perf_counter() of the last publish
        # seconds of KV work a step did after its outputs went (Engine.step's `deliver`)
        self._settling = 0.0
        self._masks = MaskBatch(model.n_vocab)  # every constrained row's mask, once a step
        self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="llama-srb-masks")
        self.branch_step = BranchStep(model.eog_tokens, self._masks)
        self.device: DeviceCut | None = None
        if on_device:
            self.device = DeviceCut(
                ctx,
                self.stats,
                device_top_k,
                chained,
                budget.n_seq,
                self._bos,
                model.n_vocab,
                model.eog_tokens,
            )
            budget.chained = chained
            budget.prefers_chain = self.device.prefers_chain
        self.sampling = SamplingStage(ctx, self.branch_step, self.stats, self.device)
        self.tier_io = TierIO(ctx, budget.tiers, self.stats)
        self._last_output_at: dict[str, float] = {}  # request id -> its last tokens' time
        # Called where the engine is about to wait on llama.cpp: before each llama_decode
        # and before an admission's KV work (copies, restores). The runtime hands the last
        # step's progress to the event loop there, so that its readers' work runs beside
        # it (runtime.py).
        self.handover: Callable[[], None] | None = None

    def close(self) -> None:
        self._mask_worker.shutdown()
        self.batch.close()
        if self.device is not None:
            self.device.close()

    @property
    def _bos(self) -> int:
        # Any valid token serves; a model without a BOS token reports -1, which would abort.
        return self.model.bos if self.model.bos >= 0 else 0

    def warm_up(self) -> None:
        self.ctx.warm_up(self._bos)

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

    def fail(
        self, requests: Iterable[Request], message: str, refused: bool = False
    ) -> list[RequestOutput]:
        """End requests with an error: the engine's, or (`refused`) their own."""
        requests = list(requests)
        for request in requests:
            request.refused = refused
        return self._end_requests(requests, FinishReason.ERROR, message)

    def fail_all(self, message: str) -> list[RequestOutput]:
        """After an unexpected engine error or at shutdown: end everything in flight."""
        return self.fail(self.scheduler.requests, message)

    # -- live branching: a writer acts on one branch of a running request ---------------
    # A fork is no action here: it is a new request whose prompt is the branch's text, and
    # admission forks the branch's cells into it (the prefix index: engine/prefix_index.py).

    def drop(
        self, request_id: str, index: int, refill: Branch | None = None
    ) -> tuple[int | None, list[RequestOutput]]:
        """End choice `index` of a running request now (FinishReason.DROPPED); with `refill`,
        a fresh branch from the same prompt goes on under a new index, which is returned.
        LiveRefused when the choice cannot be dropped (and then `refill` is closed)."""
        try:
            request, branch = self._live_branch(request_id, index)
            if refill is not None:
                refill.index = len(request.branches)
            self._apply(self.scheduler.drop(request, branch, refill))
        except LiveRefused:
            if refill is not None:
                refill.close()
            raise
        if request.status is RequestStatus.FINISHED:
            self._last_output_at.pop(request_id, None)
        delta = ChoiceDelta(branch.index, "", [], FinishReason.DROPPED)
        return (refill.index if refill is not None else None), [self._output(request, [delta])]

    def steer(
        self, request_id: str, index: int, sampler: Sampler | None, append: list[int]
    ) -> list[RequestOutput]:
        """Change choice `index` from its next token: a new sampler chain (it takes the
        branch's tokens as its history first), and the writer's words to take next as if
        the model had written them. LiveRefused when it cannot (then `sampler` is closed)."""
        try:
            _, branch = self._live_branch(request_id, index)
        except LiveRefused:
            if sampler is not None:
                sampler.close()
            raise
        if sampler is not None:
            for token in branch.tokens:  # penalties, DRY and a grammar see its text so far
                sampler.accept(token)
            branch.close()
            branch.sampler = sampler
        branch.forced += append
        return []

    def _live_branch(self, request_id: str, index: int) -> tuple[Request, Branch]:
        """Choice `index` of a running request, if a drop or a steer may act on it."""
        request = self.scheduler.find(request_id)
        if request is None:
            raise LiveRefused(409, "the request has finished: fork its choices instead")
        if request.best_of is not None:
            raise LiveRefused(409, "best_of ranks its branches when all end: none can change")
        if request.n_branches < request.spec.n_choices:
            raise LiveRefused(
                409, "a greedy request decodes one branch for all its choices: fork it instead"
            )
        if request.status is RequestStatus.WAITING:
            raise LiveRefused(409, "the request is still queued: wait for its first tokens")
        branch = next((b for b in request.branches if b.index == index), None)
        if branch is None:
            raise LiveRefused(404, f"the request has no choice {index}")
        if branch.finish_reason is not None:
            raise LiveRefused(409, f"choice {index} has ended ({branch.finish_reason.value})")
        return request, branch

    # -- the step ----------------------------------------------------------------------

    def step(
        self, deliver: Callable[[list[RequestOutput]], None] | None = None
    ) -> list[RequestOutput]:
        """Run one decode step and return the outputs it produced: its admissions, the
        progress of long prompts, and every branch's new text. `deliver`: called with them
        (the snapshot published first) before the KV cache is changed for the branches
        that ended, so that their readers do not wait for it (64 paths parked: ~190
        sequence ops, ~14 ms at n_ctx 32,768)."""
        started, decoding = time.perf_counter(), self.stats.decode_seconds
        plan = self.scheduler.schedule()
        self._observe_admission(plan)
        if plan.kv_ops and self.handover is not None:
            self.handover()
        for seq_id in self._apply(plan.kv_ops):
            self.scheduler.restore_failed(plan, seq_id)
        outputs = [self._output(request, [], admitted=True) for request in plan.admitted]
        ended: list[KvOp] = []  # what the branches that ended change in the KV cache
        if not plan.empty:
            self.watch.begin(r.request_id for r in plan.requests)
            try:
                outputs += self._run(plan, ended)
            except Exception as exc:  # keep serving: fail what was in flight, not the server
                log.exception("engine step failed")
                self._apply(ended)  # before fail_all's own, which are planned after them
                ended = []
                outputs += self.fail_all(f"engine error: {exc}")
            finally:
                self.watch.end()
            decoded = self.stats.decode_seconds - decoding
            host = time.perf_counter() - started - decoded + self._settling
            self.stats.host_step_seconds.observe(host)
            self._settling = 0.0
        if self._snapshot_due(plan, outputs):
            self.publish_snapshot()  # before the outputs: their reader finds them counted
        if deliver is not None:
            deliver(outputs)
        settling = time.perf_counter()
        self._apply(ended)
        # counted in the next step's host time, which waits for it
        self._settling += time.perf_counter() - settling
        return outputs

    def _snapshot_due(self, plan: StepPlan, outputs: list[RequestOutput]) -> bool:
        scheduler = self.scheduler
        return bool(
            plan.admitted
            or not scheduler.running
            or len(scheduler.waiting) != self.snapshot.requests_waiting
            or any(output.finished for output in outputs)
            or time.perf_counter() - self._published_at >= SNAPSHOT_SECONDS
        )

    def _run(self, plan: StepPlan, ended: list[KvOp]) -> list[RequestOutput]:
        """Decode the plan's calls, each sampled before the next overwrites its logits;
        then what was sampled ends branches and requests (their KV ops go to `ended`, for
        the caller to apply), or goes out."""
        failed: list[RequestOutput] = []
        progress: list[RequestOutput] = []
        sampled: Sampled = {}
        seconds = 0.0
        for call in plan.calls(self.tokens_per_call):
            masks = self._start_masks(call)  # while llama_decode runs
            try:
                rows, elapsed = self._decode(call)
            except DecodeError as exc:  # this call failed: its requests end, others go on
                masks.result()  # its matchers are not touched again before it is done
                failed += self.fail(call.requests, str(exc))
                continue
            seconds += elapsed
            self._apply(self.scheduler.prefilled(call))
            drew = self.sampling.run(call, rows, masks.result())
            for request, delta in drew.deltas:
                sampled.setdefault(id(request), (request, []))[1].append(delta)
            self._apply(drew.rewinds)
            for request, error in drew.broken:
                failed += self.fail([request], error, refused=True)
            for request, error in drew.failed.values():
                failed += self.fail([request], error)
            progress += [self._progress(c) for c in call.prefill if not c.completes_prompt]
        self.stats.steps += 1
        n_prefill = plan.n_tokens - len(plan.decode)
        self.pacer.observe(len(plan.decode), n_prefill, seconds)
        steps = list(sampled.values())
        ended += self.scheduler.postprocess(steps)
        outputs = [self._output(request, choices) for request, choices in steps]
        self._observe_gaps(outputs)
        return failed + progress + outputs

    def publish_snapshot(self) -> None:
        """Replace `snapshot` (one reference assignment: readers see old or new, whole)."""
        self._published_at = time.perf_counter()
        scheduler, budget = self.scheduler, self.scheduler.budget
        self.stats.generated_tokens = self.branch_step.drawn
        self.snapshot = EngineSnapshot(
            stats=self.stats.copy(),
            requests_running=len(scheduler.running),
            requests_waiting=len(scheduler.waiting),
            sequences_running=budget.live,
            kv_cells_reserved=budget.cells_reserved,
            kv_cells_used=budget.cells_used,
            kv_cells_cached=budget.cache.cells(),
            kv_cells_total=budget.n_cells,
            tiers=budget.tiers.counters.copy() if budget.tiers is not None else None,
        )

    def _decode(self, call: DecodeCall) -> tuple[CallRows, float]:
        """One llama_decode call: the decode rows first (output row i is the call's i-th),
        then the prompt chunks. Returns what its rows hold (each chunk's last output row,
        -1: none; those read as the device's candidates), and the seconds llama_decode
        took."""
        batch = self.batch
        batch.clear()
        for request, branch in call.decode:
            # a refilled branch has no token yet: its prompt's last, for its first row
            token = branch.tokens[-1] if branch.tokens else request.prompt[-1]
            batch.add(token, self._pos(request, branch), branch.seq_id, True)
        chunk_rows = []
        for chunk in call.prefill:
            request = chunk.request
            tokens = request.prompt[chunk.start : chunk.end]
            chunk_rows.append(
                batch.add_span(
                    tokens,
                    chunk.start,
                    request.primary.seq_id,
                    chunk.completes_prompt,
                    logits_all=request.prompt_logprobs,
                )
            )
        device = self.device
        rows = CallRows(chunk_rows) if device is None else device.plan(call, batch, chunk_rows)
        if self.handover is not None:
            self.handover()
        started = time.perf_counter()
        self.ctx.decode(batch)
        elapsed = time.perf_counter() - started
        self.stats.decode_seconds += elapsed
        self.stats.decode_step_seconds.observe(elapsed)
        self.stats.prompt_tokens_evaluated += call.n_tokens - len(call.decode)
        if device is not None:
            device.read(rows)
        return rows, elapsed

    def _observe_admission(self, plan: StepPlan) -> None:
        for request in plan.admitted:
            wait = request.times.queue_wait
            if wait is not None:
                self.stats.queue_wait_seconds.observe(wait)
        if plan.blocked is Shortage.SEQUENCES:
            self.stats.steps_short_of_sequences += 1
        elif plan.blocked is Shortage.CELLS:
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

    # -- the grammars' masks, computed while llama_decode runs ---------------------------

    def _start_masks(self, call: DecodeCall) -> Future[dict[int, Bitmask]]:
        """The next tokens each constrained branch of this call's rows may take, by branch:
        computed by llguidance (in one call, on its own threads, outside the GIL) while
        llama_decode runs, as they depend only on each branch's tokens so far."""
        branches = [b for c in call.prefill if c.completes_prompt for b in c.request.live]
        branches += [branch for _, branch in call.decode]
        matchers = {
            id(branch): branch.sampler.matcher
            for branch in branches
            if branch.sampler is not None and branch.sampler.matcher is not None
        }
        if not matchers:
            return NO_MASKS

        def fill() -> dict[int, Bitmask]:
            rows = self._masks.fill(list(matchers.values())).copy()
            return dict(zip(matchers, rows, strict=True))

        return self._mask_worker.submit(fill)

    # -- outputs -----------------------------------------------------------------------

    def _end_requests(
        self, requests: Iterable[Request], reason: FinishReason, error: str | None = None
    ) -> list[RequestOutput]:
        """End every branch of each request at once (abort, failure)."""
        outputs = []
        for request in list(requests):
            self._last_output_at.pop(request.request_id, None)
            choices = [ChoiceDelta(branch.index, "", [], reason) for branch in request.live]
            self._apply(self.scheduler.end_request(request, reason, error))
            outputs.append(self._output(request, choices))
        return outputs

    @staticmethod
    def _output(
        request: Request, choices: list[ChoiceDelta], admitted: bool = False
    ) -> RequestOutput:
        if request.best_of is not None:  # held until it ends, then the best n
            choices = request.best_of.collect(request, choices)
        # A deterministic request decodes one branch for all its choices (engine/spec.py).
        copies = request.spec.n_choices if request.n_branches < request.spec.n_choices else 1
        if copies > 1:
            choices = [delta.for_choice(i) for delta in choices for i in range(copies)]
        return RequestOutput(
            request_id=request.request_id,
            choices=choices,
            n_choices=request.spec.n_choices,
            prompt_tokens=request.prompt_len,
            completion_tokens=request.completion_tokens * copies,
            times=request.times,
            cached_tokens=request.n_cached,
            finished=request.status is RequestStatus.FINISHED,
            error=request.error,
            refused=request.refused,
            prompt_logprobs=request.prompt_scores if request.prompt_logprobs else None,
            admitted=admitted,
        )

    def _progress(self, chunk: PrefillChunk) -> RequestOutput:
        """A prompt read in part: how far (the API streams it as prompt progress)."""
        output = self._output(chunk.request, [])
        output.prompt_processed = chunk.end
        return output

    def _apply(self, ops: Iterable[KvOp]) -> list[int]:
        """Apply KV changes in order; returns the sequences whose restore failed (emptied:
        their requests read the prompt instead)."""
        failed: list[int] = []
        for op in ops:
            if isinstance(op, KvSave):
                self.tier_io.save(op)
            elif isinstance(op, KvRestore):
                if not self.tier_io.restore(op):
                    failed.append(op.dst)
            elif op.is_remove:
                self.ctx.seq_rm(op.dst, op.p0, op.p1)
            else:
                self.ctx.seq_cp(op.src, op.dst, op.p0, op.p1)
        for seq_id in failed:  # and whatever was copied after the failed restore
            self.ctx.seq_rm(seq_id)
        return failed

    def save_cache(self) -> None:
        """Copy every cached path down to the tiers and write them to disk: at shutdown,
        once the engine thread has stopped, so that the stories survive a restart."""
        budget = self.scheduler.budget
        if budget.tiers is None:
            return
        for path in budget.cache.paths:
            self.tier_io.save(budget.cache.save_op(path))
        budget.tiers.flush()

    @staticmethod
    def _pos(request: Request, branch: Branch) -> int:
        # The newest token of a branch sits right after the prompt and its earlier tokens.
        return request.prompt_len + len(branch.tokens) - 1

"""Admission, chunked prefill, the plan of each decode step, and every change of state.

Each step carries one token for every live branch of every decoding request (continuous
batching) and fills the rest of the batch with prompt chunks of admitted requests
(chunked prefill), so running streams never wait behind a long prompt. Both the queue and
the prompt share of a step are served by client, fairly (engine/share.py).
A prompt that starts like an earlier live request's prompt forks that part from it
instead of computing it again, waiting for it if it is still being prefilled.

This is the one place where requests and branches change status (admitted, prefilled,
forked, ended) and where their KV cells are released. It never calls llama.cpp: what
must change there comes back as `KvOp`s, which the engine applies.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import groupby

from llama_srb.engine.kv import Grant, KvBudget, KvOp, Shortage
from llama_srb.engine.outputs import ChoiceDelta, FinishReason, LiveRefused
from llama_srb.engine.pacing import StepPacer
from llama_srb.engine.request import Branch, Request, RequestStatus
from llama_srb.engine.share import (
    FairQueue,
    Reserve,
    ShareRules,
    fair_key,
    hold,
    holdings,
)
from llama_srb.engine.spec import unit_of

PROMPT_LOGPROBS_CHUNK = 64


@dataclass(frozen=True)
class PrefillChunk:
    request: Request
    start: int
    end: int

    @property
    def completes_prompt(self) -> bool:
        return self.end == self.request.prompt_len


@dataclass(frozen=True)
class DecodeCall:
    """One llama_decode call: the decode rows of whole requests, then prompt chunks."""

    decode: tuple[tuple[Request, Branch], ...] = ()
    prefill: tuple[PrefillChunk, ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(c.end - c.start for c in self.prefill)

    @property
    def requests(self) -> list[Request]:
        """Every request with tokens in this call, once each."""
        both = [r for r, _ in self.decode] + [c.request for c in self.prefill]
        return list({id(r): r for r in both}.values())


@dataclass
class StepPlan:
    """One step: the KV changes before it, its tokens, and what admission did."""

    kv_ops: list[KvOp] = field(default_factory=list)  # applied before the batch is decoded
    decode: list[tuple[Request, Branch]] = field(default_factory=list)
    prefill: list[PrefillChunk] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)  # left the queue this step
    blocked: Shortage | None = None  # why the request whose turn it was still waits

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(c.end - c.start for c in self.prefill)

    @property
    def requests(self) -> list[Request]:
        """Every request with tokens in this step, once each."""
        return DecodeCall(tuple(self.decode), tuple(self.prefill)).requests

    def calls(self, max_tokens: int) -> list[DecodeCall]:
        """The step as llama_decode calls of at most `max_tokens` tokens each (0: one
        call), packed in order and whole: a request's decode rows, or a prompt chunk, are
        never split between calls (one larger than the limit gets a call of its own)."""
        if max_tokens <= 0 or self.n_tokens <= max_tokens:
            return [DecodeCall(tuple(self.decode), tuple(self.prefill))]
        calls: list[tuple[list[tuple[Request, Branch]], list[PrefillChunk]]] = []
        filled = max_tokens  # tokens in the last call: none yet, so the first unit opens one

        def call_with_room(size: int) -> tuple[list[tuple[Request, Branch]], list[PrefillChunk]]:
            nonlocal filled
            if filled + size > max_tokens:
                calls.append(([], []))
                filled = 0
            filled += size
            return calls[-1]

        for _, group in groupby(self.decode, key=lambda row: id(row[0])):
            rows = list(group)
            call_with_room(len(rows))[0].extend(rows)
        for chunk in self.prefill:
            call_with_room(chunk.end - chunk.start)[1].append(chunk)
        return [DecodeCall(tuple(decode), tuple(prefill)) for decode, prefill in calls]


class Scheduler:
    def __init__(
        self,
        budget: KvBudget,
        n_batch: int,
        pacer: StepPacer | None = None,
        share: ShareRules | None = None,
    ) -> None:
        """`share`: the fair-share rules; its reserve sequences are part of the budget's
        `max_live`, beyond what large requests may hold."""
        self.budget = budget
        self.n_batch = n_batch
        self.pacer = pacer or StepPacer()
        self.share = share or ShareRules()
        large = budget.max_live - self.share.reserve_sequences
        self.reserve = Reserve(self.share, large, budget.n_cells)
        self.waiting = FairQueue()
        self.running: list[Request] = []  # admitted: prefilling or decoding, in that order

    def add(self, request: Request) -> None:
        self.waiting.add(request)

    def find(self, request_id: str) -> Request | None:
        for request in (*self.running, *self.waiting):
            if request.request_id == request_id:
                return request
        return None

    @property
    def requests(self) -> list[Request]:
        """Every request not finished: running ones first, then waiting ones."""
        return [*self.running, *self.waiting]

    @property
    def has_work(self) -> bool:
        """Whether the next step has anything to decode. Every running request has (its
        prompt, or tokens to generate); a waiting one only once it can be admitted."""
        if self.running:
            return True
        first = self.waiting.next({}, set())  # on an idle server, the oldest request's turn
        return first is not None and self.budget.can_admit(first)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.budget.new_step()
        held: Counter[str] | None = None  # who holds what: only for admissions and prompts
        if len(self.waiting):
            held = self._held()
            self._admit(plan, held)
        for request in self.running:
            if request.status is RequestStatus.DECODING:
                plan.decode.extend((request, branch) for branch in request.live)
        room = self.pacer.prefill_room(len(plan.decode), self.n_batch - len(plan.decode))
        # Prompt room as the queue: first the clients that hold the fewest sequences.
        prefilling = [r for r in self.running if r.status is RequestStatus.PREFILLING]
        if len(prefilling) > 1:
            held = held if held is not None else self._held()
            prefilling.sort(key=lambda r: fair_key(held, r))
        for request in prefilling:
            if room <= 0:
                break
            shares = self.budget.cache.enabled and not request.prompt_logprobs
            if shares and self._share_live_prefix(request, plan.kv_ops):
                continue  # an earlier request is computing this prompt's start: wait for it
            limit = self._chunk_limit(request, alone=not plan.decode)
            end = min(limit, request.n_prefilled + self._chunk_room(request, room))
            plan.prefill.append(PrefillChunk(request, request.n_prefilled, end))
            room -= end - request.n_prefilled
        return plan

    @staticmethod
    def _chunk_room(request: Request, room: int) -> int:
        # Scoring every prompt token needs a logits row per token (1 MB each for a 262k
        # vocabulary): small chunks keep llama.cpp's output buffer small.
        return min(room, PROMPT_LOGPROBS_CHUNK) if request.prompt_logprobs else room

    @staticmethod
    def _chunk_limit(request: Request, alone: bool) -> int:
        """On a step with nothing else decoding, the last prompt token is decoded in a
        chunk of its own, like a generated token. llama.cpp's kernels round differently
        for large batches than for small ones, so this makes an idle server's greedy
        output the same whether the rest of the prompt was computed just before or forked
        from the cache. Beside decoding branches the batch is shared anyway (and its shape
        varies with them), so the prompt ends in its last chunk: a step sooner to its
        first token, which under load is most of a second."""
        last = request.prompt_len - 1
        return last if alone and request.n_prefilled < last else request.prompt_len

    def _held(self) -> Counter[str]:
        """Live sequences per client and per unit (a session's address)."""
        return holdings(self.running)

    def _admit(self, plan: StepPlan, held: Counter[str]) -> None:
        """Admit in the fair order (engine/share.py) while requests fit. Once the request
        whose turn it is must wait, only small requests go past it, into the reserve."""
        passed: set[str] = set()  # clients whose turn is over this step
        waiting_for: Request | None = None  # the request whose turn it was, if it must wait
        while (request := self.waiting.next(held, passed)) is not None:
            cap, unit = self.share.client_sequences, unit_of(request.client)
            if cap and held[unit] + request.n_branches > cap:
                passed.add(unit)  # it holds its share: its own requests end first
                plan.blocked = plan.blocked or Shortage.SEQUENCES
                continue
            cells = self.budget.cells_to_reserve(request)
            small = self.reserve.is_small(request, cells)
            if waiting_for is None:
                fits = small or self.reserve.fits_large(request, cells) or not self.running
            else:
                fits = small and self.reserve.fits_small(request, cells)
            if not (fits and self.budget.can_admit(request)):
                passed.add(request.client)
                if waiting_for is None:
                    waiting_for = request
                    plan.blocked = self._shortage(request, small)
                    if not self.reserve.fits_beside_reserve(request, cells):
                        return  # it runs alone: nothing goes in until the server is idle
                continue
            self.waiting.remove(request)
            self._grant(request, self.budget.admit(request), plan)
            self.reserve.hold(request, small, cells)
            self.running.append(request)
            hold(held, request.client, request.n_branches)

    def _grant(self, request: Request, grant: Grant, plan: StepPlan) -> None:
        """Record what admission gave a request: its branches' sequence ids and the prompt
        tokens it forked from the cache; it starts prefilling."""
        for branch, seq_id in zip(request.branches, grant.seq_ids, strict=True):
            branch.seq_id = seq_id
        request.n_prefilled = request.n_cached = grant.forked
        request.status = RequestStatus.PREFILLING
        request.times = replace(request.times, admitted=time.monotonic())
        plan.kv_ops += grant.ops
        plan.admitted.append(request)

    def _shortage(self, request: Request, small: bool) -> Shortage:
        """What a waiting request lacks (its kind's share of it)."""
        if self.budget.shortage(request) is Shortage.SEQUENCES or (
            not small and not self.reserve.fits_large_sequences(request)
        ):
            return Shortage.SEQUENCES
        return Shortage.CELLS

    def _share_live_prefix(self, request: Request, ops: list[KvOp]) -> bool:
        """Fork more of the prompt from an earlier running request that holds it now (the
        prefix index's rules: engine/prefix_index.py). Returns True when one still reading
        its own prompt will provide more: then this one waits a step rather than compute
        the same tokens twice."""
        op, held, wait = self.budget.borrow(request)
        if op is not None:
            ops.append(op)
            request.n_cached += held - request.n_prefilled
            request.n_prefilled = held
        return wait

    def restore_failed(self, plan: StepPlan, seq_id: int) -> None:
        """The tier's bytes for the request whose first sequence is `seq_id` did not load:
        it reads its whole prompt, from the next step on."""
        for request in self.running:
            if request.primary.seq_id == seq_id and request.status is RequestStatus.PREFILLING:
                request.n_prefilled = request.n_cached = 0
                self.budget.restore_failed(request)
                plan.prefill = [c for c in plan.prefill if c.request is not request]
                return

    # -- live branching: a writer acts on a branch of a running request -----------------

    def drop(self, request: Request, branch: Branch, refill: Branch | None = None) -> list[KvOp]:
        """End `branch` now, as its writer asked: its cells are cached like any ended
        branch's. With `refill`, a fresh branch joins the request first (LiveRefused when
        no sequence or cells are free now): forked from the prompt with the others if the
        prompt is still being read, else with all of the prompt but its last token, which
        it decodes again for its first row."""
        ops = self._add_branch(request, refill, branch) if refill is not None else []
        if request.status is RequestStatus.PREFILLING and branch is request.primary:
            heir = next((b for b in request.live if b is not branch), None)
            if heir is not None:  # the prompt's cells go on in the heir's sequence
                branch.seq_id, heir.seq_id = heir.seq_id, branch.seq_id
                request.primary_at = request.branches.index(heir)
        held = self._cells_held(request, branch)
        ops += self._end_branch(request, branch, FinishReason.DROPPED, held)
        if not request.live:
            ops += self._retire(request)
        return ops

    def _add_branch(self, request: Request, branch: Branch, sibling: Branch) -> list[KvOp]:
        granted = self.budget.add_sequence(request)
        if granted is None:
            budget = self.budget
            raise LiveRefused(
                429,
                f"no room for a new branch now: {budget.live} of {budget.max_live} sequences"
                f" live, {budget.cells_reserved} of {budget.n_cells} KV cells reserved"
                f" (it needs {budget.refill_cells(request)}); drop without refill, or retry",
            )
        branch.seq_id, ops = granted
        request.branches.append(branch)
        self.reserve.grow(request, self.budget.refill_cells(request))
        if request.status is RequestStatus.DECODING:
            ops.append(KvOp(sibling.seq_id, branch.seq_id, 0, request.prompt_len - 1))
        return ops

    # -- after the decode: statuses and releases ---------------------------------------

    def prefilled(self, call: DecodeCall) -> list[KvOp]:
        """The call's prompt chunks are in the cache. A request whose whole prompt now is
        shares its primary's cells with every other branch (a fork) and starts decoding:
        its first tokens are sampled from this call's rows."""
        ops: list[KvOp] = []
        for chunk in call.prefill:
            request = chunk.request
            request.n_prefilled = chunk.end
            if chunk.completes_prompt:
                primary = request.primary
                ops += [KvOp(primary.seq_id, b.seq_id) for b in request.live if b is not primary]
                request.status = RequestStatus.DECODING
                request.times = replace(request.times, first_token=time.monotonic())
        return ops

    def postprocess(self, steps: list[tuple[Request, list[ChoiceDelta]]]) -> list[KvOp]:
        """Record what each branch sampled this step: a delta with a finish reason ends its
        branch, and a request without live branches ends with it."""
        ops: list[KvOp] = []
        for request, deltas in steps:
            for delta in deltas:
                if delta.finish_reason is not None:
                    branch = request.branches[delta.index]
                    # Every token it had before this step is decoded now; the one it
                    # sampled this step (if it kept it) never will be, so has no cell.
                    held = request.prompt_len + len(branch.tokens) - delta.newest_has_no_cell
                    ops += self._end_branch(request, branch, delta.finish_reason, held)
            if not request.live:
                ops += self._retire(request)
        return ops

    def end_request(
        self, request: Request, reason: FinishReason, error: str | None = None
    ) -> list[KvOp]:
        """End every live branch of a request at once (abort, failure), then the request.
        Works on requests running, waiting, or never added."""
        # An aborted request's cells are still valid and worth caching; a failed one's not.
        keep = reason is not FinishReason.ERROR
        ops: list[KvOp] = []
        for branch in request.live:
            held = self._cells_held(request, branch)
            ops += self._end_branch(request, branch, reason, held, keep)
        return ops + self._retire(request, error)

    def _end_branch(
        self, request: Request, branch: Branch, reason: FinishReason, held: int, keep: bool = True
    ) -> list[KvOp]:
        """A branch ends: its sampler is freed and its sequence id released, its cells (the
        first `held` tokens of its path) cached or freed (not cached unless `keep`: a failed
        request's are kept only while a later request borrows them)."""
        branch.finish_reason = reason
        branch.close()
        if branch.seq_id < 0:  # never admitted: holds nothing
            return []
        path = (request.prompt + branch.tokens)[:held] if held > 0 else None
        seq_id, branch.seq_id = branch.seq_id, -1
        return self.budget.release_sequence(request, seq_id, path, keep)

    def _retire(self, request: Request, error: str | None = None) -> list[KvOp]:
        """A request whose branches all ended leaves the queues and returns its cells."""
        ops: list[KvOp] = []
        if request in self.running:
            self.running.remove(request)
            self.reserve.release(request)
            ops = self.budget.release_request(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.error = error
        return ops

    @staticmethod
    def _cells_held(request: Request, branch: Branch) -> int:
        """The cells a live branch holds between steps."""
        if request.status is RequestStatus.DECODING:
            # its newest token (the prompt's last, for a refill that has none) is not decoded
            return request.prompt_len + len(branch.tokens) - 1
        return request.n_prefilled if branch is request.primary else 0  # forked at the end

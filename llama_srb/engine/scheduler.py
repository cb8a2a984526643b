"""Admission, chunked prefill and the plan of each decode step. Pure bookkeeping.

Each step carries one token for every live branch of every decoding request (continuous
batching) and fills the rest of the batch with prompt chunks of admitted requests in
arrival order (chunked prefill), so running streams never wait behind a long prompt.
A prompt that starts like an earlier live request's prompt forks that part from it
instead of computing it again, waiting for it if it is still being prefilled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llama_srb.engine.kv import MIN_SHARED_TOKENS, KvBudget, KvOp, common_prefix
from llama_srb.engine.sequence import Request, RequestStatus, Sequence

PROMPT_LOGPROBS_CHUNK = 64


@dataclass(frozen=True)
class PrefillChunk:
    request: Request
    start: int
    end: int

    @property
    def completes_prompt(self) -> bool:
        return self.end == self.request.prompt_len


@dataclass
class StepPlan:
    kv_ops: list[KvOp] = field(default_factory=list)  # applied before the batch is decoded
    decode: list[tuple[Request, Sequence]] = field(default_factory=list)
    prefill: list[PrefillChunk] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(c.end - c.start for c in self.prefill)


class Scheduler:
    def __init__(self, budget: KvBudget, n_batch: int) -> None:
        self.budget = budget
        self.n_batch = n_batch
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted: prefilling or decoding, arrival order

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def find(self, request_id: str) -> Request | None:
        for request in (*self.running, *self.waiting):
            if request.request_id == request_id:
                return request
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = StepPlan(kv_ops=self._admit())
        for request in self.running:
            if request.status is RequestStatus.DECODING:
                plan.decode.extend((request, seq) for seq in request.live)
        room = self.n_batch - len(plan.decode)
        for request in self.running:
            if room <= 0:
                break
            if request.status is not RequestStatus.PREFILLING:
                continue
            shares = self.budget.cache.enabled and not request.prompt_logprobs
            if shares and self._share_live_prefix(request, plan.kv_ops):
                continue  # an earlier request is computing this prompt's start: wait for it
            end = min(
                self._chunk_limit(request), request.n_prefilled + self._chunk_room(request, room)
            )
            plan.prefill.append(PrefillChunk(request, request.n_prefilled, end))
            room -= end - request.n_prefilled
        return plan

    @staticmethod
    def _chunk_room(request: Request, room: int) -> int:
        # Scoring every prompt token needs a logits row per token (1 MB each for a 262k
        # vocabulary): small chunks keep llama.cpp's output buffer small.
        return min(room, PROMPT_LOGPROBS_CHUNK) if request.prompt_logprobs else room

    @staticmethod
    def _chunk_limit(request: Request) -> int:
        """The last prompt token is decoded in a chunk of its own, like a generated token.
        llama.cpp's kernels round differently for large batches than for small ones, so
        this makes its logits the same whether the rest of the prompt was computed just
        before or forked from the cache: cached and cold greedy outputs agree."""
        last = request.prompt_len - 1
        return last if request.n_prefilled < last else request.prompt_len

    def _admit(self) -> list[KvOp]:
        # Strict arrival order: a large request at the head is not starved by small ones.
        ops: list[KvOp] = []
        while self.waiting and self.budget.can_admit(self.waiting[0]):
            request = self.waiting.popleft()
            ops += self.budget.admit(request)
            request.status = RequestStatus.PREFILLING
            self.running.append(request)
        return ops

    def _share_live_prefix(self, request: Request, ops: list[KvOp]) -> bool:
        """Fork the longest prompt prefix that an earlier live request already holds.
        Returns True when an earlier request still prefilling will provide more: then
        this one waits a step rather than compute the same tokens twice."""
        limit = request.prompt_len - 1  # the last token is decoded again for its logits
        best, source, promised = request.n_prefilled, -1, 0
        for other in self.running:
            if other is request:
                break
            if other.status is RequestStatus.PREFILLING:
                holder, held = other.primary.seq_id, other.n_prefilled
            elif other.live:
                holder, held = other.live[0].seq_id, other.prompt_len
            else:
                continue
            common = min(common_prefix(request.prompt, other.prompt), limit)
            if common < MIN_SHARED_TOKENS:
                continue  # a BOS or a few tokens: not worth waiting a step for
            if min(common, held) > best:
                best, source = min(common, held), holder
            if other.status is RequestStatus.PREFILLING:
                promised = max(promised, common)
        if source >= 0:
            ops.append(KvOp(source, request.primary.seq_id, request.n_prefilled, best))
            request.n_cached += best - request.n_prefilled
            request.n_prefilled = best
        return promised > request.n_prefilled

    def finish_sequence(
        self, request: Request, seq: Sequence, path: list[int] | None
    ) -> list[KvOp]:
        """Bookkeeping for a branch that ended; `path` is the token path its cells hold
        (None: do not cache them). Returns the native ops."""
        seq_id, seq.seq_id = seq.seq_id, -1
        return self.budget.release_sequence(request, seq_id, path)

    def remove(
        self, request: Request, paths: dict[int, list[int] | None] | None = None
    ) -> list[KvOp]:
        """Drop a request (finished or aborted); returns the native ops still to apply.
        `paths` maps the seq ids of branches still live to the tokens their cells hold."""
        if request in self.waiting:
            self.waiting.remove(request)
            return []
        self.running.remove(request)
        ops: list[KvOp] = []
        for seq in request.sequences:
            if seq.seq_id >= 0:
                ops += self.finish_sequence(request, seq, (paths or {}).get(seq.seq_id))
        return ops + self.budget.release_request(request)

"""Admission, chunked prefill and the plan of each decode step. Pure bookkeeping.

Each step carries one token for every live branch of every decoding request (continuous
batching) and fills the rest of the batch with prompt chunks of admitted requests in
arrival order (chunked prefill), so running streams never wait behind a long prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llama_srb.engine.kv import KvBudget
from llama_srb.engine.sequence import Request, RequestStatus, Sequence


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
        self._admit()
        plan = StepPlan()
        for request in self.running:
            if request.status is RequestStatus.DECODING:
                plan.decode.extend((request, seq) for seq in request.live)
        room = self.n_batch - len(plan.decode)
        for request in self.running:
            if room <= 0:
                break
            if request.status is RequestStatus.PREFILLING:
                end = min(request.prompt_len, request.n_prefilled + room)
                plan.prefill.append(PrefillChunk(request, request.n_prefilled, end))
                room -= end - request.n_prefilled
        return plan

    def _admit(self) -> None:
        # Strict arrival order: a large request at the head is not starved by small ones.
        while self.waiting and self.budget.can_admit(self.waiting[0]):
            request = self.waiting.popleft()
            self.budget.admit(request)
            request.status = RequestStatus.PREFILLING
            self.running.append(request)

    def finish_sequence(self, request: Request, seq: Sequence) -> int:
        """Bookkeeping for a branch that ended; returns its seq id to clear natively."""
        return self.budget.release_sequence(request, seq)

    def remove(self, request: Request) -> list[int]:
        """Drop a request (finished or aborted); returns seq ids still to clear natively."""
        if request in self.waiting:
            self.waiting.remove(request)
            return []
        self.running.remove(request)
        ids = [self.budget.release_sequence(request, s) for s in request.sequences if s.seq_id >= 0]
        self.budget.release_prompt(request)
        return ids

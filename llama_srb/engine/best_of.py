"""best_of: a request decodes `best_of` branches and returns the `n` best.

The ranking is the mean logprob of a branch's tokens (each under the model's own
distribution, as `logprobs` reports it; end-of-generation not counted, a branch without
tokens last; ties by branch order). A mean, not a sum: a sum favours whichever branch
stopped first. The chosen branches come best first, as choices 0..n-1.
"""

from __future__ import annotations

import math
from dataclasses import replace

from llama_srb.engine.outputs import ChoiceDelta
from llama_srb.engine.sequence import Request, RequestStatus, Sequence


def mean_logprob(seq: Sequence) -> float:
    if not seq.scores:
        return -math.inf
    return math.fsum(s.logprob for s in seq.scores) / len(seq.scores)


def ranked(request: Request, n: int) -> list[int]:
    """The indexes of the request's `n` best branches, best first."""
    order = sorted(request.sequences, key=lambda s: (-mean_logprob(s), s.index))
    return [seq.index for seq in order[:n]]


class BestOf:
    """Holds every branch's deltas until the request ends (best_of is never streamed),
    then returns the chosen branches' whole choices, re-indexed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._choices: dict[int, ChoiceDelta] = {}

    def collect(self, request: Request, choices: list[ChoiceDelta]) -> list[ChoiceDelta]:
        for delta in choices:
            whole = self._choices.setdefault(delta.index, ChoiceDelta(delta.index))
            whole.text += delta.text
            whole.token_ids.extend(delta.token_ids)
            if delta.logprobs:
                if whole.logprobs is None:
                    whole.logprobs = []
                whole.logprobs.extend(delta.logprobs)
            whole.finish_reason = delta.finish_reason or whole.finish_reason
        if request.status is not RequestStatus.FINISHED:
            return []
        return [
            replace(self._choices.get(index, ChoiceDelta(index)), index=rank)
            for rank, index in enumerate(ranked(request, self.n))
        ]

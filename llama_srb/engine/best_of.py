"""best_of: a request decodes `best_of` branches and returns the `n` best.

The ranking is the mean logprob of a branch's tokens (each under the model's own
distribution, as `logprobs` reports it; end-of-generation not counted, a branch without
tokens last; ties by branch order). A mean, not a sum: a sum favours whichever branch
stopped first. The chosen branches come best first, as choices 0..n-1.
"""

from __future__ import annotations

import math

from llama_srb.engine.outputs import ChoiceDelta, ChoiceSoFar
from llama_srb.engine.request import Branch, Request, RequestStatus


def mean_logprob(branch: Branch) -> float:
    if not branch.scores:
        return -math.inf
    return math.fsum(s.logprob for s in branch.scores) / len(branch.scores)


def ranked(request: Request, n: int) -> list[int]:
    """The indexes of the request's `n` best branches, best first."""
    order = sorted(request.branches, key=lambda s: (-mean_logprob(s), s.index))
    return [branch.index for branch in order[:n]]


class BestOf:
    """Holds every branch's deltas until the request ends (best_of is never streamed),
    then returns the chosen branches' whole choices, re-indexed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._choices: dict[int, ChoiceSoFar] = {}

    def collect(self, request: Request, choices: list[ChoiceDelta]) -> list[ChoiceDelta]:
        for delta in choices:
            self._choices.setdefault(delta.index, ChoiceSoFar(delta.index)).add(delta)
        if request.status is not RequestStatus.FINISHED:
            return []
        return [
            self._whole(self._choices.get(index, ChoiceSoFar(index)), rank)
            for rank, index in enumerate(ranked(request, self.n))
        ]

    @staticmethod
    def _whole(choice: ChoiceSoFar, rank: int) -> ChoiceDelta:
        logprobs = choice.logprobs or None
        return ChoiceDelta(rank, choice.text, choice.token_ids, choice.finish_reason, logprobs)

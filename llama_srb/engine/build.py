"""What the API hands the engine: a RequestSpec (engine/spec.py), built into a
Submission on a request worker (its sampler chains are C objects that take up to tens of
milliseconds to build), then given to the runtime, which takes the request out of it.

From then on the API holds the request's id and its stream of outputs only; the engine
thread owns the request. A submission that is never given (the client left, another
prompt of the call failed) is closed, which frees its samplers.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Generic, Protocol, TypeVar

from llama_srb.engine.best_of import BestOf
from llama_srb.engine.outputs import RequestTimes
from llama_srb.engine.request import Branch, Request
from llama_srb.engine.spec import RequestSpec
from llama_srb.native import Model
from llama_srb.sampling.banned import Bans
from llama_srb.sampling.branch import BranchSampler, build_samplers
from llama_srb.sampling.params import SamplingParams
from llama_srb.sampling.patterns import compiled
from llama_srb.sampling.text import TextStream


class Closes(Protocol):
    def close(self) -> None: ...


P = TypeVar("P", bound=Closes)


class Submission:
    """A request built and not yet handed to the engine."""

    def __init__(self, request: Request) -> None:
        self._request: Request | None = request
        self.request_id = request.request_id
        self.spec = request.spec

    def take(self) -> Request:
        """The request, for the runtime to hand over (once): the submission is empty."""
        request, self._request = self._request, None
        assert request is not None, "a submission is given once"
        return request

    def close(self) -> None:
        """It will never run: free its samplers."""
        if self._request is not None:
            self._request.close()
            self._request = None


class Built(Generic[P]):
    """A branch or a sampler chain built for live branching (a refill, a steer) and not
    yet handed to the engine; closed if it never is."""

    def __init__(self, part: P) -> None:
        self._part: P | None = part

    def take(self) -> P:
        part, self._part = self._part, None
        assert part is not None, "a part is given once"
        return part

    def close(self) -> None:
        if self._part is not None:
            self._part.close()
            self._part = None


def build_refill(model: Model, params: SamplingParams, seed: int) -> Built[Branch]:
    """A fresh branch for a running request (its index is given by the engine)."""
    return Built(build_branches(model, params, [seed])[0])


def build_steer(model: Model, params: SamplingParams, seed: int) -> Built[BranchSampler]:
    """A branch's new sampler chain (`params`: the branch's own, changed)."""
    return Built(build_samplers(model, params, [seed])[0])


def build(model: Model, spec: RequestSpec, now: float | None = None) -> Submission:
    """The request for `spec`, each branch with its own sampler chain (seeded `seed +
    index`, with its `choices_params` entry) and text stream. Safe off the engine thread:
    it only reads the model's vocabulary. `now`: its arrival (time.monotonic())."""
    params = spec.params
    base_seed = params.seed if params.seed is not None else random.getrandbits(32)
    seeds = [base_seed + index for index in range(spec.n_branches)]
    branches = build_branches(model, params, seeds)
    times = RequestTimes(time.monotonic() if now is None else now)
    request = Request(f"{spec.prefix}-{uuid.uuid4().hex}", spec, branches, times)
    if spec.n_branches > spec.n_choices:
        request.best_of = BestOf(spec.n_choices)
    return Submission(request)


def build_branches(model: Model, params: SamplingParams, seeds: list[int]) -> list[Branch]:
    """A branch per seed, in order (index i: `params.for_branch(i)`), each with its
    sampler chain and text stream: a request's, or a refill's (live branching)."""
    samplers = build_samplers(model, params, seeds)
    patterns = (
        compiled(params.banned_regex, params.banned_strings_case_sensitive)
        if params.banned_regex
        else None
    )
    return [
        Branch(
            index=index,
            sampler=sampler,
            text=TextStream(
                model.piece,
                params.stop,
                params.banned_strings,
                params.banned_strings_case_sensitive,
                patterns,
            ),
            bans=Bans() if params.bans_text else None,
        )
        for index, sampler in enumerate(samplers)
    ]

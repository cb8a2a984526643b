"""A Request is one prompt with its branches; a Branch is one line of generation (a choice,
or one of best_of's candidates). What a request asks for is its RequestSpec, fixed when
the API builds it (engine/build.py); what happens to it lives here, on the engine thread
only, with an enum status and derived properties, never in tuples threaded through queues.

One writer per field: the scheduler changes statuses, KV state (sequence ids, prefilled
and cached counts) and times; the branch step (engine/branch_step.py) a branch's tokens,
text and scores. The KV cells a running request reserved are counted in kv.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from llama_srb.engine.outputs import FinishReason, RequestTimes
from llama_srb.engine.spec import RequestSpec
from llama_srb.sampling.banned import Bans
from llama_srb.sampling.constraint import Matcher
from llama_srb.sampling.logprobs import TokenLogprob
from llama_srb.sampling.params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds nothing
    PREFILLING = "prefilling"  # admitted: holds sequence ids and cells, prompt partly decoded
    DECODING = "decoding"  # prompt done, branches generate one token per step
    FINISHED = "finished"


class BranchText(Protocol):
    """Turns a branch's sampled tokens into text (detokenizer + stop strings + banned
    phrases and patterns: sampling/text.py's TextStream)."""

    def push(self, token: int, check_stops: bool, final: bool = False) -> str: ...
    def end_banned_at(self) -> int | None: ...
    def flush(self) -> str: ...
    def rewind(self, index: int) -> None: ...
    @property
    def stopped(self) -> bool: ...
    @property
    def released(self) -> int: ...
    @property
    def banned_at(self) -> int | None: ...


class Sampler(Protocol):
    """A branch's sampler chain (sampling/branch.py): the next token from a row (never
    one of `forbidden` nor one its grammar's `mask` refuses; with `taken`, a distinct
    opening), and back to fewer tokens. `matcher`: its place in its grammar, if any.
    `device_k`: how many of a row's most likely tokens decide its pick, when a device's
    top-K can (sampling/device_row.py), else None; `device_pick`: that pick as a C loop
    makes it for a call's rows at once (engine/device_cut.py), if it can."""

    matcher: Matcher | None

    @property
    def device_k(self) -> int | None: ...
    @property
    def device_pick(self) -> Any: ...
    def picked_on_device(self) -> None: ...

    def sample(
        self, row: Any, forbidden: Any = None, taken: set[int] | None = None, mask: Any = None
    ) -> int: ...
    def accept(self, token: int) -> None: ...
    def close(self) -> None: ...
    def rewind(self, kept: list[int]) -> None: ...


class Collector(Protocol):
    """Holds a request's choices until it ends and says which to return (best_of)."""

    def collect(self, request: Request, choices: list[Any]) -> list[Any]: ...


@dataclass(eq=False)
class Branch:
    index: int  # its position in the request: the choice index, before best_of ranks
    sampler: Sampler | None = None
    text: BranchText | None = None
    seq_id: int = -1  # llama.cpp sequence id while live, else -1
    tokens: list[int] = field(default_factory=list)  # generated so far
    finish_reason: FinishReason | None = None
    # The logprob of each token in `tokens`, when the request asks for logprobs or ranks
    # its branches (best_of); cut back with `tokens` on a rewind.
    scores: list[TokenLogprob] = field(default_factory=list)
    bans: Bans | None = None  # with banned strings: the tokens banned at each position
    # The writer's words (live branching's `append`): taken, one per step, before the
    # sampler draws again, as if the model had written them.
    forced: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def close(self) -> None:
        """Free the native sampler: the branch ended, or will never run."""
        if self.sampler is not None:
            self.sampler.close()


@dataclass(eq=False)
class Request:
    request_id: str
    spec: RequestSpec
    branches: list[Branch]
    times: RequestTimes
    status: RequestStatus = RequestStatus.WAITING
    n_prefilled: int = 0  # prompt tokens whose KV is already in the cache
    n_cached: int = 0  # of those, how many were shared from cached or live sequences
    # The primary's position: the first branch, until it is dropped while the prompt is
    # read (its sequence then goes to the next live one: Scheduler.drop).
    primary_at: int = 0
    error: str | None = None
    refused: bool = False  # the error is the request's own: its grammar cannot go on
    prompt_scores: list[TokenLogprob | None] = field(default_factory=list)
    # With banned strings: the logits of the prompt's last token and their column maxima,
    # for a branch rewound to its first token (the row is gone once branches decode on).
    first_row: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None
    # best_of: decodes every branch, returns the best n when it ends (engine/best_of.py).
    best_of: Collector | None = None

    # -- what was asked (the spec) ---------------------------------------------------

    @property
    def prompt(self) -> list[int]:
        return self.spec.prompt

    @property
    def params(self) -> SamplingParams:
        return self.spec.params

    @property
    def arrival(self) -> float:
        return self.times.arrival

    @property
    def client(self) -> str:
        """Who sent it (an API key's name, a session, an address): the unit of fair share."""
        return self.spec.client

    @property
    def prompt_logprobs(self) -> bool:
        """echo + logprobs: every prompt position needs its logits, so the whole prompt is
        computed here (a prefix shared from another sequence would have none)."""
        return self.spec.prompt_logprobs

    @property
    def prompt_len(self) -> int:
        return len(self.spec.prompt)

    @property
    def n_branches(self) -> int:
        return len(self.branches)

    @property
    def cells_needed(self) -> int:
        return self.spec.cells_needed

    # -- where it stands ---------------------------------------------------------------

    @property
    def scores_tokens(self) -> bool:
        """Whether each sampled token's logprob is computed (a numpy pass over its row)."""
        return self.params.logprobs is not None or self.best_of is not None

    def masks_end(self, branch: Branch) -> bool:
        """Whether end of generation is masked for the branch's next token (`ignore_eos`,
        or fewer tokens than `min_tokens`)."""
        params = self.params
        return params.ignore_eos or len(branch.tokens) < params.min_tokens

    @property
    def primary(self) -> Branch:
        """The branch the prompt is prefilled into before being forked to the others."""
        return self.branches[self.primary_at]

    @property
    def live(self) -> list[Branch]:
        return [b for b in self.branches if not b.finished]

    @property
    def completion_tokens(self) -> int:
        return sum(len(b.tokens) for b in self.branches)

    def close(self) -> None:
        """Free every branch's sampler: for a request built but never submitted."""
        for branch in self.branches:
            branch.close()

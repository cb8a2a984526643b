"""What the engine says about a request, the only thing that crosses back to the API: per
request and step, the new text of each choice, and the request's counts and times so far.

The API never reads the engine's own request objects: everything it reports (the
client's n, tokens, cached tokens, queue wait, time to first token) is here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llama_srb.sampling.logprobs import TokenLogprob


class LiveRefused(Exception):
    """A live action (drop, refill, steer) that cannot be done now: `status` is the HTTP
    status the API answers (404: no such choice; 409: the request or choice is past it;
    429: no room for a refill now)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-generation token or stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # cancelled (client gone, timeout, shutdown)
    ERROR = "error"  # the engine failed on this request
    DROPPED = "dropped"  # its writer dropped this choice while it streamed (live branching)


@dataclass
class ChoiceDelta:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked
    # The branch's newest token was sampled this step: it has no KV cell yet. (token_ids
    # are what the text stream released, which held-back text can delay.)
    newest_has_no_cell: bool = False

    def for_choice(self, index: int) -> ChoiceDelta:
        """The same delta for choice `index` (dataclasses.replace costs several times
        more, once per choice per step)."""
        return ChoiceDelta(
            index,
            self.text,
            self.token_ids,
            self.finish_reason,
            self.logprobs,
            self.newest_has_no_cell,
        )


@dataclass
class ChoiceSoFar:
    """One choice as its deltas add up: the one fold of ChoiceDeltas (best_of, gathered
    answers, llama.cpp's results, the tests). `first_at`/`ended_at` are the times given to
    `add` with its first delta and its last (perf_counter seconds, for timings)."""

    index: int
    parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    first_at: float | None = None
    ended_at: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, delta: ChoiceDelta, now: float = 0.0) -> None:
        if self.first_at is None:
            self.first_at = now
        self.parts.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.ended_at = now


@dataclass(frozen=True)
class RequestTimes:
    """time.monotonic() seconds: when the request arrived, was admitted (its sequence ids
    and cells granted) and gave its first token; None until then."""

    arrival: float
    admitted: float | None = None
    first_token: float | None = None

    @property
    def queue_wait(self) -> float | None:
        return None if self.admitted is None else self.admitted - self.arrival


@dataclass
class RequestOutput:
    request_id: str
    choices: list[ChoiceDelta]
    n_choices: int  # the choices the client asked for (n), not the branches decoded
    prompt_tokens: int
    completion_tokens: int  # every token generated, by all branches (best_of's included)
    times: RequestTimes
    cached_tokens: int = 0
    finished: bool = False
    error: str | None = None
    # The error is the request's own (its grammar cannot go on: a limit, a dead end), not
    # the server's: the API answers it as a client error.
    refused: bool = False
    # echo + logprobs: one per prompt token, None where there is none (the first token)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # While a long prompt is read in chunks: its tokens in the KV cache so far (cached ones
    # included). Set only on these progress outputs, which carry no choices.
    prompt_processed: int | None = None
    # Set on the one output that reports the admission (the first after it)
    admitted: bool = False

"""A Request is one prompt with `n` Sequences; a Sequence is one branch (one choice).

A request's state lives on these two objects, with an enum status and derived
properties, never in tuples threaded through queues; only the scheduler changes a status.
The KV cells a running request reserved are counted in kv.py.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from llama_srb.sampling.banned import Bans
from llama_srb.sampling.constraint import Matcher
from llama_srb.sampling.logprobs import TokenLogprob
from llama_srb.sampling.params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds nothing
    PREFILLING = "prefilling"  # admitted: holds seq ids and cells, prompt partly decoded
    DECODING = "decoding"  # prompt done, branches generate one token per step
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-generation token or stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # cancelled (client gone, timeout, shutdown)
    ERROR = "error"  # the engine failed on this request


class Decoder(Protocol):
    """Turns a sequence's sampled tokens into text (detokenizer + stop strings + banned
    phrases: sampling/text.py)."""

    def push(self, token: int, check_stops: bool) -> str: ...
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
    opening), and back to fewer tokens. `matcher`: its place in its grammar, if any."""

    matcher: Matcher | None

    def sample(
        self, row: Any, forbidden: Any = None, taken: set[int] | None = None, mask: Any = None
    ) -> int: ...
    def close(self) -> None: ...
    def rewind(self, kept: list[int]) -> None: ...


class Collector(Protocol):
    """Holds a request's choices until it ends and says which to return (best_of)."""

    def collect(self, request: Request, choices: list[Any]) -> list[Any]: ...


@dataclass(eq=False)
class Sequence:
    index: int  # the choice index inside its request
    sampler: Sampler | None = None
    decoder: Decoder | None = None
    seq_id: int = -1  # llama.cpp sequence id while live, else -1
    tokens: list[int] = field(default_factory=list)  # generated so far
    finish_reason: FinishReason | None = None
    # The logprob of each token in `tokens`, when the request asks for logprobs or ranks
    # its branches (best_of); cut back with `tokens` on a rewind.
    scores: list[TokenLogprob] = field(default_factory=list)
    bans: Bans | None = None  # with banned strings: the tokens banned at each position

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
    prompt: list[int]
    params: SamplingParams
    sequences: list[Sequence]
    status: RequestStatus = RequestStatus.WAITING
    n_prefilled: int = 0  # prompt tokens whose KV is already in the cache
    n_cached: int = 0  # of those, how many were shared from cached or live sequences
    arrival: float = field(default_factory=time.monotonic)
    # Who sent it (an API key's name, a session, an address): the unit of fair share.
    client: str = ""
    first_token_at: float | None = None
    error: str | None = None
    # echo + logprobs: every prompt position needs its logits, so the whole prompt is
    # computed here (a prefix shared from another sequence would have none).
    prompt_logprobs: bool = False
    prompt_scores: list[TokenLogprob | None] = field(default_factory=list)
    # With banned strings: the logits of the prompt's last token and their column maxima,
    # for a branch rewound to its first token (the row is gone once branches decode on).
    first_row: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None
    # best_of: decodes every sequence, returns the best n when it ends (engine/best_of.py).
    best_of: Collector | None = None

    @property
    def scores_tokens(self) -> bool:
        """Whether each sampled token's logprob is computed (a numpy pass over its row)."""
        return self.params.logprobs is not None or self.best_of is not None

    @property
    def n(self) -> int:
        return len(self.sequences)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def primary(self) -> Sequence:
        """The sequence the prompt is prefilled into before being forked to the others."""
        return self.sequences[0]

    @property
    def live(self) -> list[Sequence]:
        return [s for s in self.sequences if not s.finished]

    @property
    def cells_needed(self) -> int:
        """Worst-case KV cells: the prompt once (shared by all branches) + every branch."""
        return self.prompt_len + self.n * self.params.max_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    def close(self) -> None:
        """Free every branch's sampler: for a request built but never submitted."""
        for seq in self.sequences:
            seq.close()

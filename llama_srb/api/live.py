"""Live branching on the API's side: the calls a writer may still act on, by response id.

Every /v1/completions and /v1/chat/completions call is recorded here as its outputs pass
(`LiveCall.observe`): who made it, its body, each prompt's engine request and tokens, and
each choice's released tokens and text so far. A fork reads a choice from here (never from
the engine: the text a rewind may still take back is not released, so never forked); a
drop or a steer finds the engine request to act on. A call stays while it runs and, once
it ends, among the last `RECENT_CALLS` ended ones (a fork of those reads the cache).
Only the caller that made a call may act on it: to anyone else it does not exist.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llama_srb.api.errors import APIError
from llama_srb.api.input.prompts import choice_index, prompt_position
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.engine.outputs import ChoiceSoFar, RequestOutput
from llama_srb.engine.spec import RequestSpec
from llama_srb.native import Model

RECENT_CALLS = 256  # ended calls kept for forks: each holds its choices' token ids
# What a fork of a call builds: the route's preparation for a body and a prompt's tokens
# (routes/completions.py, routes/chat.py), typed loosely here to keep the API's layers apart.
Relaunch = Callable[[SamplingFields, list[int] | None], Any]


@dataclass(eq=False)
class LiveCall:
    response_id: str
    client: str
    model: str  # the model it runs on (api/models.py): its forks, drops and steers too
    body: SamplingFields
    relaunch: Relaunch
    specs: list[RequestSpec]  # one per prompt position
    request_ids: list[str]  # the engine's request per prompt position
    choices: dict[int, ChoiceSoFar] = field(default_factory=dict)  # by the client's index
    steered: dict[int, dict[str, object]] = field(default_factory=dict)  # sampler changes
    refills: int = 0  # refilled choices so far (their indices follow the first n)
    ended: bool = False

    @property
    def n(self) -> int:
        return self.specs[0].n_choices

    def observe(self, position: int, output: RequestOutput) -> None:
        for delta in output.choices:
            index = choice_index(position, self.n, delta.index)
            self.choices.setdefault(index, ChoiceSoFar(index)).add(delta)

    def refilled(self, index: int) -> None:
        """A refill goes on under `index`: a choice to act on before its first token."""
        self.refills += 1
        self.choices.setdefault(index, ChoiceSoFar(index))

    def locate(self, index: int) -> tuple[int, int]:
        """Choice `index` as (prompt position, the engine's branch index), or a 404."""
        if index < 0 or (index >= len(self.specs) * self.n and index not in self.choices):
            raise APIError(404, f"completion {self.response_id} has no choice {index}")
        if index >= len(self.specs) * self.n:  # a refill's: only one-prompt calls have them
            return 0, index
        return prompt_position(index, self.n), index % self.n

    def text_of(self, index: int) -> tuple[list[int], str]:
        """Choice `index`'s released tokens and text so far."""
        self.locate(index)
        choice = self.choices.get(index)
        return (list(choice.token_ids), choice.text) if choice is not None else ([], "")


class LiveCalls:
    """The registry: running calls, and the most recent ended ones (event-loop thread)."""

    def __init__(self, recent: int = RECENT_CALLS) -> None:
        self._calls: OrderedDict[str, LiveCall] = OrderedDict()
        self._recent = recent
        self._ended = 0

    def open(self, call: LiveCall) -> None:
        self._calls[call.response_id] = call

    def end(self, call: LiveCall) -> None:
        """The call's outputs are over: it moves to the ended ones, the oldest of which go."""
        if call.ended:
            return
        call.ended = True
        self._ended += 1
        self._calls.move_to_end(call.response_id)
        if self._ended > self._recent:
            for response_id, old in list(self._calls.items()):
                if old.ended:
                    del self._calls[response_id]
                    self._ended -= 1
                    break

    def get(self, response_id: str, client: str) -> LiveCall:
        """The caller's call with this id, or a 404 (also when it is someone else's)."""
        call = self._calls.get(response_id)
        if call is None or call.client != client:
            raise APIError(
                404,
                f"no running or recent completion `{response_id}` of yours: live actions take"
                " the `id` of a completion this client made (the last"
                f" {self._recent} ended ones are kept)",
                code="completion_not_found",
            )
        return call


def fork_point(model: Model, tokens: list[int], text: str, at: int | None) -> list[int]:
    """The tokens a fork continues from: the choice's released tokens up to character
    `at` of its text (None: all of them). Up to the last token boundary at or before `at`
    they are the choice's own (their cells are forked); the text between that boundary and
    `at` is tokenized anew (the few tokens a fork reads)."""
    if at is None:
        return tokens
    if at > len(text):
        raise APIError(
            400, f"`at` is {at}, past the choice's {len(text)} characters so far", param="at"
        )
    head = text[:at]
    lo, hi = 0, len(tokens)  # the most tokens whose text is a prefix of `head`
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if head.startswith(model.text(tokens[:mid])):
            lo = mid
        else:
            hi = mid - 1
    rest = head[len(model.text(tokens[:lo])) :]
    return tokens[:lo] + (
        model.tokenize(rest, add_special=False, parse_special=False) if rest else []
    )

"""The one way every generation route answers: the cheap checks, the route's `prepare` on
a request worker (tokens, constraints, sampler chains: input/), the requests submitted
(service.py), and their outputs rendered by the route's answer (render/), streamed or
whole; a client that leaves aborts them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.clients import Caller
from llama_srb.api.render.sse import sse_response
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.service import Merged, check_request, submit, until_disconnect
from llama_srb.api.state import AppState
from llama_srb.engine.build import Submission
from llama_srb.loader import LoadedEngine


class Answer(Protocol):
    """How a route renders one call's outputs: as server-sent events, or whole."""

    def events(self, outputs: Merged) -> AsyncIterator[str]: ...
    async def collect(self, outputs: Merged) -> object: ...


@dataclass
class Prepared:
    """A call ready to go: its engine requests built, and the answer that renders them."""

    submissions: list[Submission]
    answer: Answer

    def close(self) -> None:
        for submission in self.submissions:
            submission.close()


Prepare = Callable[[LoadedEngine, Caller], Prepared]


async def respond(
    state: AppState, http: Request, body: SamplingFields, n_prompts: int, prepare: Prepare
) -> Response:
    """Check, prepare on a worker, submit, and answer: streamed (`body.stream`) or whole."""
    caller = state.caller(http)
    loaded = check_request(state, body, n_prompts, caller)
    prepared = await state.workers.run(lambda: prepare(loaded, caller), Prepared.close)
    outputs = submit(state, prepared.submissions, caller)
    if body.stream:
        return sse_response(prepared.answer.events(outputs))
    return JSONResponse(await until_disconnect(http, prepared.answer.collect(outputs)))

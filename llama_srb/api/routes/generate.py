"""The one way every generation route answers (OpenAI's, llama.cpp's, KoboldCpp's): the
cheap checks, the route's `prepare` on a request worker (tokens, constraints, sampler
chains: input/), the requests submitted (service.py), and their outputs rendered by the
route's answer (render/), streamed or whole; a client that leaves aborts them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.clients import Caller
from llama_srb.api.live import LiveCall
from llama_srb.api.render.sse import sse_response
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.service import Merged, check_request, submit, until_disconnect
from llama_srb.api.state import AppState
from llama_srb.engine.build import Submission
from llama_srb.served import Served


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


Prepare = Callable[[Served, Caller], Prepared]
# A route's preparation for a body and, for a fork, the prompt's tokens (api/live.py)
Relaunch = Callable[[SamplingFields, list[int] | None], Prepare]
# Told of a call built and about to be submitted (on the event loop), which it may still
# close and empty: KoboldCpp's genkeys, whose abort may come while the call is built.
Submitting = Callable[[Prepared], None]


async def respond(
    state: AppState,
    http: Request,
    body: SamplingFields,
    n_prompts: int,
    prepare: Prepare,
    relaunch: Relaunch | None = None,
    *,
    stream: bool | None = None,
    submitting: Submitting | None = None,
) -> Response:
    """Check, prepare on a worker, submit, and answer: streamed or whole, as `stream` says
    where the route decides it (KoboldCpp's two routes), else `body.stream`. With
    `relaunch` (how to prepare a fork of it), the call is open to live branching."""
    caller = state.caller(http)
    loaded = check_request(state, body, n_prompts, caller)
    prepared = await state.workers.run(lambda: prepare(loaded, caller), Prepared.close)
    if submitting is not None:
        submitting(prepared)
    live = None
    if relaunch is not None:
        subs = prepared.submissions
        specs, ids = [s.spec for s in subs], [s.request_id for s in subs]
        live = LiveCall(ids[0], caller.client, body, relaunch, specs, ids)
    outputs = submit(state, prepared.submissions, caller, live)
    if body.stream if stream is None else stream:
        return sse_response(prepared.answer.events(outputs))
    return JSONResponse(await until_disconnect(http, prepared.answer.collect(outputs)))

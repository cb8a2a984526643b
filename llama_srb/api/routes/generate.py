"""The one way every generation route answers (OpenAI's, llama.cpp's, KoboldCpp's): the
cheap checks, the route's `prepare` on a request worker (tokens, constraints, sampler
chains: input/), the requests submitted (service.py), and their outputs rendered by the
route's answer (render/), streamed or whole; a client that leaves aborts them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from llama_srb.api.clients import Caller
from llama_srb.api.live import LiveCall
from llama_srb.api.models import ModelSlot
from llama_srb.api.render.sse import error_event, sse_response
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.service import Merged, check_request, submit, until_disconnect
from llama_srb.api.state import AppState
from llama_srb.engine.build import Submission


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


Prepare = Callable[[ModelSlot, Caller], Prepared]  # on a worker, its model held
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
    failed: Callable[[], None] | None = None,
) -> Response:
    """Check, prepare on a worker, submit, and answer: streamed or whole, as `stream` says
    where the route decides it (KoboldCpp's two routes), else `body.stream`. With
    `relaunch` (how to prepare a fork of it), the call is open to live branching.

    A streamed request whose model must load first gets its stream at once, with a
    comment line (`: loading model …`, which event-stream readers skip) every
    LOAD_NOTICE_S while it loads; a failure from then on is the stream's error event, and
    `failed` is told (a failure before that is raised here)."""
    streamed = body.stream if stream is None else stream
    slot = state.models.slot(body.model)  # a 404 for a model not served here
    call = Call(state, http, body, n_prompts, prepare, relaunch, submitting, failed)
    if streamed and slot.served is None:
        return sse_response(call.after_load(slot))
    outputs, answer = await call.start()
    if streamed:
        return sse_response(answer.events(outputs))
    return JSONResponse(await until_disconnect(http, answer.collect(outputs)))


LOAD_NOTICE_S = 2.0


@dataclass
class Call:
    """One call on its way in: `start` checks, prepares and submits it."""

    state: AppState
    http: Request
    body: SamplingFields
    n_prompts: int
    prepare: Prepare
    relaunch: Relaunch | None
    submitting: Submitting | None
    failed: Callable[[], None] | None

    async def start(self) -> tuple[Merged, Answer]:
        state, body = self.state, self.body
        caller = state.caller(self.http)
        async with state.use(body.model) as slot:  # loaded on demand, held until submitted
            loaded = check_request(state, slot.ready(), body, self.n_prompts, caller)
            prepared = await state.workers.run(lambda: self.prepare(slot, caller), Prepared.close)
            if self.submitting is not None:
                self.submitting(prepared)
            live = None
            if self.relaunch is not None:
                subs = prepared.submissions
                specs, ids = [s.spec for s in subs], [s.request_id for s in subs]
                live = LiveCall(ids[0], caller.client, slot.name, body, self.relaunch, specs, ids)
            return submit(state, loaded, prepared.submissions, caller, live), prepared.answer

    async def after_load(self, slot: ModelSlot) -> AsyncIterator[str]:
        """The stream of a call whose model loads first: notices, then its answer."""
        began = time.monotonic()
        loading = asyncio.ensure_future(self.state.models.load(slot))
        try:
            while not loading.done():
                yield f": loading model {slot.name} ({time.monotonic() - began:.0f} s)\n\n"
                await asyncio.wait([loading], timeout=LOAD_NOTICE_S)
            loading.result()
            outputs, answer = await self.start()
        except Exception as exc:  # before its answer began: the one error event
            if self.failed is not None:
                self.failed()
            yield error_event(exc, self.http.url.path)
            return
        finally:
            loading.cancel()  # the waiter only: the load itself goes on (Models.load)
        async for line in answer.events(outputs):
            yield line

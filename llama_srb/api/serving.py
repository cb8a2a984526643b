"""What every generation route shares: checks, building engine requests, disconnects."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from llama_srb.api.backpressure import refuse_if_full
from llama_srb.api.errors import APIError, interrupted_error, sse_error
from llama_srb.api.protocol import SamplingFields
from llama_srb.api.request_log import RequestLog
from llama_srb.api.state import AppState
from llama_srb.engine.engine import build_request
from llama_srb.engine.generation import Interrupted
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.sequence import Request as EngineRequest
from llama_srb.loader import LoadedEngine
from llama_srb.sampling.params import SamplingParams

T = TypeVar("T")


def check_request(state: AppState, body: SamplingFields, n_prompts: int) -> LoadedEngine:
    """The cheap checks, on the event loop before anything is built: the model name, `n`,
    and room in the queue for all `n_prompts` prompts of the request at once."""
    settings, loaded = state.settings, state.ready()
    if body.model and body.model != settings.model_name:
        raise APIError(
            404,
            f"model `{body.model}` is not served here; this server serves `{settings.model_name}`",
            param="model",
            code="model_not_found",
        )
    if not 1 <= body.n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}, got {body.n}", param="n")
    refuse_if_full(loaded.runtime, settings.max_queue, n_prompts)  # valid, no room: 429 / 503
    return loaded


def build(
    loaded: LoadedEngine,
    n: int,
    prompt: list[int],
    params: SamplingParams,
    prefix: str,
    prompt_logprobs: bool = False,
) -> EngineRequest:
    """The engine request for one prompt, its sampler chains built (a worker thread's job)."""
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    needed = len(prompt) + n * params.max_tokens
    if needed > loaded.n_ctx:
        raise APIError(
            400,
            f"this request needs {needed} tokens of context ({len(prompt)} in the prompt + "
            f"n={n} × max_tokens={params.max_tokens}) but the server has {loaded.n_ctx}; "
            "shorten the prompt or lower n or max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    return build_request(loaded.model, request_id, prompt, params, n, prompt_logprobs)


def discard(requests: list[EngineRequest]) -> None:
    """Free the native samplers of requests that were built but will never be submitted."""
    for request in requests:
        request.close()


def generate(state: AppState, request: EngineRequest) -> AsyncIterator[RequestOutput]:
    """Submit now (the queue bound counts it at once); outputs are logged as they pass."""
    settings, loaded = state.settings, state.ready()
    generation = loaded.runtime.generate(request, timeout=settings.request_timeout or None)
    return RequestLog(state.metrics, loaded.model, settings.log_prompts).track(generation)


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    # Starlette cancels `events` when the client disconnects, which aborts the request.
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        _ended_cleanly(events), media_type="text/event-stream", headers=headers
    )


async def _ended_cleanly(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream the runtime interrupts (timeout, shutdown) still ends in OpenAI's way:
    an error event, then `[DONE]`; the status line went out long ago."""
    try:
        async for event in events:
            yield event
    except Interrupted as exc:
        error = interrupted_error(exc)
        yield sse_error(error.message, error.status, error.code)
        yield "data: [DONE]\n\n"


async def until_disconnect(http: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so aborting its request) if the client leaves."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # let it unwind (aborting its request) before reading it
    if task.cancelled():
        raise APIError(499, "the client disconnected")
    return task.result()

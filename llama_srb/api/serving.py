"""What every generation route shares: checks, building the engine request, disconnects."""

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
from llama_srb.sampling.params import SamplingParams

T = TypeVar("T")


def prepare(
    state: AppState,
    body: SamplingFields,
    prompt: list[int],
    params: SamplingParams,
    prefix: str,
    prompt_logprobs: bool = False,
) -> EngineRequest:
    """Validate a generation against the server's limits and build its engine request."""
    settings, engine = state.settings, state.ready()
    if body.model and body.model != settings.model_name:
        raise APIError(
            404,
            f"model `{body.model}` is not served here; this server serves `{settings.model_name}`",
            param="model",
            code="model_not_found",
        )
    if not 1 <= body.n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}, got {body.n}", param="n")
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    needed = len(prompt) + body.n * params.max_tokens
    if needed > engine.n_ctx:
        raise APIError(
            400,
            f"this request needs {needed} tokens of context ({len(prompt)} in the prompt + "
            f"n={body.n} × max_tokens={params.max_tokens}) but the server has {engine.n_ctx}; "
            "shorten the prompt or lower n or max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    refuse_if_full(engine.runtime, settings.max_queue)  # valid but no room: 429 / 503
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    return build_request(engine.model, request_id, prompt, params, body.n, prompt_logprobs)


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
    if task.cancelled():
        raise APIError(499, "the client disconnected")
    return task.result()

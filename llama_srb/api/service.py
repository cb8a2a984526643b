"""A generation request's way through the server, for every route: the cheap checks, the
engine requests built (sampler chains and all; a worker thread's job), submitted, and their
outputs as one stream; a disconnect aborts them.

Refusals come before anything is built, so they cost nothing: a full queue (429) or a
shutdown (503). Admission itself (live sequences, KV cells, strict arrival order) is the
scheduler's business; this only bounds how many accepted requests may wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Protocol, TypeVar

from fastapi import Request

from llama_srb.api.errors import APIError
from llama_srb.api.input.prompts import Prompt
from llama_srb.api.request_log import RequestLog
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.state import AppState
from llama_srb.engine.engine import build_request
from llama_srb.engine.generation import Interrupted
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.runtime import Runtime
from llama_srb.engine.sequence import Request as EngineRequest
from llama_srb.loader import LoadedEngine
from llama_srb.sampling.params import SamplingParams

T = TypeVar("T")

# Seconds a refused client should wait: about one short generation on a busy server.
RETRY_AFTER_S = 1


def _refuse_if_full(runtime: Runtime, max_queue: int, incoming: int = 1) -> None:
    """`incoming`: the engine requests this call will submit (one per prompt of a list)."""
    if runtime.closing:
        raise APIError(503, "the server is shutting down", code="server_shutting_down")
    if incoming > max_queue:
        raise APIError(
            400,
            f"this request carries {incoming} prompts, but at most {max_queue} requests may"
            " wait on this server (--max-queue): send fewer prompts per request",
            param="prompt",
        )
    waiting = runtime.waiting
    if waiting + incoming > max_queue:
        raise APIError(
            429,
            f"the server is busy: {waiting} requests are already waiting (queue limit"
            f" {max_queue}); retry after {RETRY_AFTER_S} s",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


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
    _check_best_of(body, settings.max_n)
    _refuse_if_full(loaded.runtime, settings.max_queue, n_prompts)  # valid, no room: 429 / 503
    return loaded


def _check_best_of(body: SamplingFields, max_n: int) -> None:
    best_of = body.best_of
    if best_of is None:
        return
    if not body.n <= best_of <= max_n:
        raise APIError(
            400,
            f"best_of must be between n ({body.n}) and {max_n} (--max-n), got {best_of}",
            param="best_of",
        )
    if body.stream and best_of > body.n:
        raise APIError(
            400,
            "best_of cannot be streamed: the best choices are known only when all are done;"
            " send stream: false, or leave best_of out",
            param="best_of",
        )


def build(
    loaded: LoadedEngine,
    n: int,
    prompt: list[int],
    params: SamplingParams,
    prefix: str,
    prompt_logprobs: bool = False,
    best_of: int | None = None,
) -> EngineRequest:
    """The engine request for one prompt, its sampler chains built (a worker thread's job).
    With `best_of` (> n), that many branches are decoded and the n best returned."""
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    branches = max(n, best_of or 0)
    needed = len(prompt) + branches * params.max_tokens
    if needed > loaded.n_ctx:
        raise APIError(
            400,
            f"this request needs {needed} tokens of context ({len(prompt)} in the prompt + "
            f"{branches} branches × max_tokens={params.max_tokens}) but the server has"
            f" {loaded.n_ctx}; shorten the prompt or lower n, best_of or max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    return build_request(loaded.model, request_id, prompt, params, n, prompt_logprobs, best_of)


def build_all(
    loaded: LoadedEngine,
    n: int,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    prefix: str,
    prompt_logprobs: bool = False,
    best_of: int | None = None,
) -> list[EngineRequest]:
    """One engine request per prompt; if any cannot be built, none is kept."""
    requests: list[EngineRequest] = []
    try:
        for prompt in prompts:
            tokens = prompt.tokens
            requests.append(build(loaded, n, tokens, params, prefix, prompt_logprobs, best_of))
    except BaseException:
        discard(requests)
        raise
    return requests


def discard(requests: list[EngineRequest]) -> None:
    """Free the native samplers of requests that were built but will never be submitted."""
    for request in requests:
        request.close()


def submit(
    state: AppState, requests: Sequence[EngineRequest]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Submit every request of a call now (the queue bound counts them at once): their
    outputs as one stream, each tagged with its request's position in `requests` and
    logged on its way (api/request_log.py)."""
    settings, loaded = state.settings, state.ready()
    timeout = settings.request_timeout or None
    generations = [loaded.runtime.generate(request, timeout=timeout) for request in requests]
    log = RequestLog(state.metrics, loaded.model, settings.log_prompts, requests)
    return merge(generations, log)


class Outputs(Protocol):
    """One request's outputs: a runtime Generation (or, in tests, any async generator)."""

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...
    async def __anext__(self) -> RequestOutput: ...
    async def aclose(self) -> None: ...


async def merge(
    streams: Sequence[Outputs], log: RequestLog | None = None
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The outputs of several requests as they come, each with its stream's position.

    Leaving early (disconnect, cancellation) closes every stream, which aborts its request.
    """
    tasks: list[asyncio.Task[None]] = []
    try:
        if len(streams) == 1:  # the usual case: no tasks, cancellation reaches the stream
            async for out in streams[0]:
                if log is not None:
                    log.observe(0, out)
                yield 0, out
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(position: int, stream: Outputs) -> None:
            try:
                async for out in stream:
                    queue.put_nowait((position, out))
            except Exception as exc:  # handed to the consumer, not lost in a task
                queue.put_nowait((position, exc))
            finally:
                queue.put_nowait((position, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        running = len(tasks)
        while running:
            position, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                if log is not None:
                    log.observe(position, item)
                yield position, item
    except Interrupted as exc:
        if log is not None:
            log.interrupted(exc)
        raise
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
        if log is not None:
            log.close()


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

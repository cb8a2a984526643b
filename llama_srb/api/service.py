"""A generation request's way through the server, for every route (routes/generate.py
strings it together): the cheap checks before anything is built, then `submit`: the
requests handed to the engine and their outputs as one stream, each request logged once
it ends; a disconnect aborts them. After `submit` the API knows a request by its id and
its outputs only (engine/build.py).

Refusals come before anything is built, so they cost nothing: a full queue, the server's
or the client's own (429), a shutdown or a stuck engine (503). Admission itself (live
sequences, KV cells, fair share between clients) is the scheduler's business; this only
bounds how many accepted requests may wait for it, in all and per client.

The log line is JSON (easy to grep and to ship): id, client, key name, n,
prompt/cached/generated tokens, time to first token, total time, finish reasons and
outcome; the prompt's text only with --log-prompts, as prompts are users' writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from fastapi import Request

from llama_srb.api.clients import Caller
from llama_srb.api.errors import APIError
from llama_srb.api.live import LiveCall, LiveCalls
from llama_srb.api.metrics import ServerMetrics
from llama_srb.api.schemas.sampling import SamplingFields
from llama_srb.api.state import AppState
from llama_srb.engine.build import Submission
from llama_srb.engine.generation import Interrupted, RequestTimedOut
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.spec import RequestSpec
from llama_srb.served import Doorway, Served, Tokenizer

T = TypeVar("T")
log = logging.getLogger("llama_srb.requests")

# Seconds a refused client should wait: about one short generation on a busy server.
RETRY_AFTER_S = 1


def _refuse_if_full(
    runtime: Doorway, max_queue: int, client_max_queue: int, client: str, incoming: int = 1
) -> None:
    """`incoming`: the engine requests this call will submit (one per prompt of a list);
    they count against the client's own share of the queue as well as the server's."""
    if runtime.closing:
        raise APIError(503, "the server is shutting down", code="server_shutting_down")
    if incoming > client_max_queue:
        raise APIError(
            400,
            f"this request carries {incoming} prompts, but at most {client_max_queue} requests"
            " of one client may wait on this server (--client-max-queue, --max-queue): send"
            " fewer prompts per request",
            param="prompt",
        )
    mine = runtime.waiting_of(client)
    if mine + incoming > client_max_queue:
        _queue_full(f"{mine} of your requests are already waiting (limit {client_max_queue})")
    waiting = runtime.waiting
    if waiting + incoming > max_queue:
        _queue_full(f"{waiting} requests are already waiting (queue limit {max_queue})")


def _queue_full(why: str) -> None:
    raise APIError(
        429,
        f"the server is busy: {why}; retry after {RETRY_AFTER_S} s",
        code="queue_full",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _refuse_if_stuck(state: AppState) -> None:
    step = state.stuck()
    if step is not None:
        raise APIError(
            503,
            f"the engine has been in one step for over {state.settings.stuck_after:g} s"
            " (--stuck-after); new requests would only wait behind it",
            code="engine_stuck",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )


def check_request(
    state: AppState, loaded: Served, body: SamplingFields, n_prompts: int, caller: Caller
) -> Served:
    """The cheap checks, on the event loop before anything is built (the model is
    `loaded`, the one the request names: api/models.py): `n`, and room in the queue (the
    server's and the caller's) for all `n_prompts` prompts of the request at once."""
    settings = state.settings
    if not 1 <= body.n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}, got {body.n}", param="n")
    _check_best_of(body, settings.max_n)
    _refuse_if_stuck(state)
    queue, client_queue = settings.max_queue, settings.client_queue
    _refuse_if_full(loaded.runtime, queue, client_queue, caller.client, n_prompts)  # 429 / 503
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


Merged = AsyncIterator[tuple[int, RequestOutput]]  # a call's outputs, by prompt position


def submit(
    state: AppState,
    loaded: Served,
    submissions: Sequence[Submission],
    caller: Caller | None = None,
    live: LiveCall | None = None,
) -> Merged:
    """Hand every request of a call to the engine now (the queue bound counts them at
    once): their outputs as one stream, each tagged with its request's position in
    `submissions` and logged on its way (RequestLog); with `live`, recorded for live
    branching too (api/live.py)."""
    settings = state.settings
    timeout = settings.request_timeout or None
    records = [RequestRecord(s.request_id, s.spec) for s in submissions]
    generations = [loaded.runtime.generate(s, timeout=timeout) for s in submissions]
    key = caller.key if caller is not None else None
    log = RequestLog(state.metrics, loaded.model, settings.log_prompts, records, key)
    if live is not None:
        state.live.open(live)
        log.live = (state.live, live)
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


# -- one log line and the latency metrics per engine request ---------------------------------


@dataclass
class RequestRecord:
    """One engine request as its outputs told it: the log line and the latency metrics."""

    request_id: str
    spec: RequestSpec
    last: RequestOutput | None = None
    reasons: list[str | None] = field(default_factory=list)
    outcome: str = "cancelled"  # until a final output or an interruption says otherwise
    error: str | None = None
    ended: bool = False

    def observe(self, output: RequestOutput) -> None:
        self.last = output
        if not self.reasons:
            self.reasons = [None] * output.n_choices
        for delta in output.choices:
            if delta.finish_reason is not None:
                self.reasons += [None] * (delta.index + 1 - len(self.reasons))  # a refill's
                self.reasons[delta.index] = delta.finish_reason.value
        if output.finished:
            self.outcome = "error" if output.error else "completed"
            self.error = output.error

    def line(self, prompt_text: str | None, key: str | None) -> str:
        last, spec = self.last, self.spec
        times = last.times if last is not None else None
        arrival = times.arrival if times is not None else None
        first = times.first_token if times is not None else None
        fields: dict[str, object] = {
            "event": "request",
            "id": self.request_id,
            "client": spec.client,
            "key": key,
            "outcome": self.outcome,
            "n": spec.n_choices,
            "best_of": spec.best_of,
            "prompt_tokens": len(spec.prompt),
            "cached_tokens": last.cached_tokens if last is not None else 0,
            "generated_tokens": last.completion_tokens if last is not None else 0,
            "queue_ms": _ms(times.queue_wait) if times is not None else None,
            "ttft_ms": None if first is None or arrival is None else _ms(first - arrival),
            "total_ms": None if arrival is None else _ms(time.monotonic() - arrival),
            "finish_reasons": self.reasons or [None] * spec.n_choices,
        }
        if self.error:
            fields["error"] = self.error
        if prompt_text is not None:
            fields["prompt"] = prompt_text
        return json.dumps(fields, ensure_ascii=False)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class RequestLog:
    """The records of one call's engine requests (one per prompt), fed as outputs pass:
    each request's line is logged, and its latency observed, once it ends."""

    def __init__(
        self,
        metrics: ServerMetrics,
        model: Tokenizer,
        log_prompts: bool,
        records: list[RequestRecord],
        key: str | None = None,
    ) -> None:
        self.metrics = metrics
        self.model = model
        self.log_prompts = log_prompts
        self.records = records
        self.key = key
        self.live: tuple[LiveCalls, LiveCall] | None = None  # the call, for live branching

    def observe(self, position: int, output: RequestOutput) -> None:
        if output.prompt_processed is not None:  # the prompt read in part: no tokens yet
            return
        if self.live is not None:
            self.live[1].observe(position, output)
        record = self.records[position]
        before = record.last.times.first_token if record.last is not None else None
        record.observe(output)
        first = output.times.first_token
        if before is None and first is not None:
            self.metrics.time_to_first_token.observe(first - output.times.arrival)
        if output.finished:
            self._end(record)

    def interrupted(self, exc: Interrupted) -> None:
        """The runtime ended the call (timeout, shutdown): so ended every unfinished request."""
        for record in self.records:
            if not record.ended:
                record.outcome = "timeout" if isinstance(exc, RequestTimedOut) else "shutdown"
                record.error = str(exc)

    def close(self) -> None:
        """The call is over: what has not ended yet was cancelled (or interrupted)."""
        for record in self.records:
            self._end(record)
        if self.live is not None:
            self.live[0].end(self.live[1])

    def _end(self, record: RequestRecord) -> None:
        if record.ended:
            return
        record.ended = True
        last = record.last
        if last is not None:
            self.metrics.request_duration.observe(time.monotonic() - last.times.arrival)
        self.metrics.requests_ended.labels(record.outcome).inc()
        if self.key is not None:
            tokens = last.completion_tokens if last is not None else 0
            self.metrics.key_requests.labels(self.key, record.outcome).inc()
            self.metrics.key_tokens.labels(self.key).inc(tokens)
        prompt = self.model.text(record.spec.prompt) if self.log_prompts else None
        log.info("%s", record.line(prompt, self.key))

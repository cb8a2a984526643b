"""Off the event loop: worker threads for the heavy part of a request (its body parsed:
api/deps.py; tokenizing it, compiling a grammar, building n sampler chains), from
milliseconds to seconds each; on the event loop they would freeze every other client
(`/health` included). The threads have the big stack that compiling a deeply nested
grammar needs (native.py). And the request bodies' models in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel

from llama_srb.native import native_thread

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

_Job = tuple[Future[Any], Callable[[], Any]]


class Workers:
    """A fixed set of daemon threads that run blocking jobs for the event loop."""

    def __init__(self, count: int) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [native_thread(self._work, f"llama-srb-prepare-{i}") for i in range(count)]

    async def run(self, job: Callable[[], T], discard: Callable[[T], None] | None = None) -> T:
        """`job()`'s result. If the caller is cancelled meanwhile (client gone), the job
        still finishes and `discard` frees what it built (native samplers)."""
        future: Future[T] = Future()
        self._jobs.put((future, job))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if discard is not None:
                future.add_done_callback(lambda done: _discard_result(done, discard))
            raise

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started: nothing was built
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the awaiting request, not lost
                future.set_exception(exc)


def _discard_result(future: Future[T], discard: Callable[[T], None]) -> None:
    if not future.cancelled() and future.exception() is None:
        discard(future.result())


def body_spec(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose body `parsed(model)` reads."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def document_bodies(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Add `models` (and the models they use) to the OpenAPI document's components."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()  # FastAPI keeps it as app.openapi_schema: completed in place
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            spec = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(spec.pop("$defs", {}))
            components[model.__name__] = spec
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

"""How a route reaches the server's state: one FastAPI dependency, `app_state` (a test
swaps it with `app.dependency_overrides`), and the request bodies parsed on its workers.

Parsing a body of megabytes (a story to tokenize, a vocabulary-wide logit_bias) takes
milliseconds to seconds; on the event loop it would freeze every other client (`/health`
included). pydantic parses the raw bytes on the request workers, or on the event loop for
a body of at most 8 KiB, whose parse costs less than the hop (its JSON parser also
refuses lone UTF-16 surrogates, which are not text), after a check that every number in
them is finite (api/finite.py: NaN, Infinity and 1e400 are 400s); since FastAPI no longer
reads the body itself, routes declare its model for the OpenAPI document with
`workers.body_spec`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from llama_srb.api.errors import APIError
from llama_srb.api.finite import check_finite
from llama_srb.api.state import AppState

M = TypeVar("M", bound=BaseModel)
# A body this small is parsed on the event loop: at most ~0.3 ms here even when it is all
# numbers (a prompt of token ids, a logit_bias), less than the hop to a worker and back.
INLINE_BODY_BYTES = 8 * 1024


async def app_state(http: Request) -> AppState:
    """The server's state (settings, the engine once loaded, metrics, workers). (A
    coroutine: FastAPI runs a plain function dependency on a thread of its pool, a hop
    each request.)"""
    state: AppState = http.app.state.srb
    return state


State = Annotated[AppState, Depends(app_state)]


def parsed(model: type[M]) -> Callable[..., Awaitable[M]]:
    """A FastAPI dependency: the body as `model`, or a 400 (a RequestValidationError, or
    an APIError naming a number that is not finite)."""

    def decode(raw: bytes) -> M:
        check_finite(raw)
        return model.model_validate_json(raw)

    async def parse(http: Request, state: State) -> M:
        try:
            raw = await http.body()
        except ClientDisconnect:  # gone before its body arrived: nobody to answer
            raise APIError(499, "the client disconnected") from None
        try:
            if len(raw) <= INLINE_BODY_BYTES:
                return decode(raw)
            return await state.workers.run(lambda: decode(raw))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parse

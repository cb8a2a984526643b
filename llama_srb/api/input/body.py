"""Request bodies parsed and validated on a worker thread, never on the event loop.

A body may be megabytes (a story to tokenize, a vocabulary-wide logit_bias): parsing and
validating it took seconds of the event loop, freezing every other client. Here pydantic
parses the raw bytes (its JSON parser also refuses lone UTF-16 surrogates, which are not
text) on the request workers; routes declare the model for the OpenAPI document with
`body_spec`, since FastAPI no longer reads the body itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from llama_srb.api.errors import APIError

M = TypeVar("M", bound=BaseModel)


def parsed(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A FastAPI dependency: the body as `model`, or a RequestValidationError (a 400)."""

    async def parse(http: Request) -> M:
        try:
            raw = await http.body()
        except ClientDisconnect:  # gone before its body arrived: nobody to answer
            raise APIError(499, "the client disconnected") from None
        workers = http.app.state.srb.workers
        try:
            return await workers.run(lambda: model.model_validate_json(raw))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parse


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

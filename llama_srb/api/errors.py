"""OpenAI-style error objects: every failure a client sees has this shape and a 4xx/5xx
(KoboldCpp's own shape on its API's routes, /api/...)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llama_srb.engine.generation import EngineDied, Interrupted, RequestTimedOut, Unloaded
from llama_srb.engine.outputs import LiveRefused, RequestOutput
from llama_srb.sampling.params import ParamError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# KoboldCpp's API (routes/kobold.py) answers errors in its own shape.
KOBOLD_PREFIX = "/api/"
_KOBOLD_TYPES = {401: "unauthorized", 429: "service_unavailable", 503: "service_unavailable"}


def kobold_error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """KoboldCpp's `{"detail": {"msg", "type"}}`, with our `code` beside them when there is
    one (what OpenAI's shape calls `code`: clients that know only KoboldCpp's skip it)."""
    kind = _KOBOLD_TYPES.get(status, "server_error" if status >= 500 else "bad_input")
    detail = {"msg": message, "type": kind}
    if code is not None:
        detail["code"] = code
    return {"detail": detail}


def body_for(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The error object in the shape the route's clients read."""
    if path.startswith(KOBOLD_PREFIX):
        return kobold_error_body(status, message, code)
    return error_body(status, message, param, code)


def error_response(exc: APIError, path: str = "") -> JSONResponse:
    body = body_for(path, exc.status, exc.message, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


Failure = RequestOutput | BaseException


def api_error(failure: Failure) -> APIError:
    """Whatever ended a request, as the error its client gets: status, message, param and
    code (the type follows from the status: `error_body`). The one mapping, for answers
    whole (the exception handlers) and streamed (render/sse.py's error event) alike, so a
    request's own fault is a 4xx either way and only the server's is a 5xx."""
    if isinstance(failure, RequestOutput):
        return _output_error(failure)
    if isinstance(failure, APIError):
        return failure
    if isinstance(failure, ParamError):
        return APIError(400, str(failure), failure.param)
    if isinstance(failure, RequestValidationError):
        message, param = _describe_validation(failure)
        return APIError(400, message, param)
    if isinstance(failure, Interrupted):
        return _interrupted_error(failure)
    if isinstance(failure, LiveRefused):
        return APIError(failure.status, failure.message, code="choice_unavailable")
    if isinstance(failure, StarletteHTTPException):
        headers = dict(failure.headers) if failure.headers else None
        return APIError(failure.status_code, str(failure.detail), headers=headers)
    return APIError(500, f"internal error: {type(failure).__name__}")


def _output_error(out: RequestOutput) -> APIError:
    """An engine output's error: the request's own (its constraint cannot go on: 400) or
    the server's (500)."""
    assert out.error is not None
    if out.refused:
        return APIError(400, out.error, code="constraint_failed")
    return APIError(500, out.error, code="engine_error")


def _interrupted_error(exc: Interrupted) -> APIError:
    """A request the runtime ended (timeout: 504; shutdown, its model unloaded or the
    engine gone: 503)."""
    if isinstance(exc, RequestTimedOut):
        return APIError(504, str(exc), code="request_timeout")
    if isinstance(exc, Unloaded):
        code = "model_unloaded"
    else:
        code = "engine_failed" if isinstance(exc, EngineDied) else "server_shutting_down"
    return APIError(503, str(exc), code=code)


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    kind = first.get("type")
    if kind == "json_invalid":
        reason = str(first.get("ctx", {}).get("error", ""))
        if "surrogate" in reason or "hex escape" in reason:  # JSON allows them, UTF-8 not
            return (
                f"the request body holds a lone UTF-16 surrogate such as \\ud800 ({reason}),"
                " which is not text: send valid Unicode",
                None,
            )
        return f"the request body is not valid JSON ({reason})" if reason else (
            "the request body is not valid JSON"
        ), None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if not loc and kind == "value_error":  # a check of the whole body: its own message
        return str(first.get("msg", "invalid request body")).removeprefix("Value error, "), None
    if not loc:
        return "the request body must be a JSON object (send Content-Type: application/json)", None
    param = ".".join(loc)
    return f"`{param}`: {first.get('msg', 'invalid value')}", param


def install_error_handlers(app: FastAPI) -> None:
    """Every failure through `api_error`. Starlette picks a handler by the exception's
    class, so each class FastAPI or Starlette handles on their own is named here."""

    async def _handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(api_error(exc), request.url.path)

    for kind in (
        APIError,
        ParamError,
        RequestValidationError,
        Interrupted,
        LiveRefused,
        StarletteHTTPException,
        Exception,
    ):
        app.add_exception_handler(kind, _handle)

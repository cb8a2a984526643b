"""ASGI middleware: request counting by route and status, API keys, body size limit,
which pages may call the API (api/origins.py), security headers.

Pure ASGI (no BaseHTTPMiddleware), so streaming responses and client disconnects pass
through untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llama_srb.api.auth import RequireKey
from llama_srb.api.errors import error_body
from llama_srb.api.metrics import ServerMetrics
from llama_srb.api.origins import OriginGate, OriginPolicy
from llama_srb.api.state import AppState

# The UI is static files of its own origin: scripts, styles and calls only from there, no
# inline code, never inside another site's frame. The favicon is a `data:` URL.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        b" connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self';"
        b" frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def install_middleware(app: FastAPI, state: AppState, open_paths: Collection[str]) -> None:
    """Added innermost first; counting is outermost, so 401s, 413s and preflights are
    counted; the origin gate wraps the key check, so browsers see its 401s and preflights
    (which carry no key) pass."""
    settings, metrics = state.settings, state.metrics
    app.add_exception_handler(BodyTooLarge, _body_too_large)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if state.keys.required:
        app.add_middleware(RequireKey, keys=state.keys, open_paths=open_paths)
    policy = OriginPolicy.of(
        settings.cors_origins, keyed=state.keys.required, library=settings.library_origins
    )
    app.add_middleware(OriginGate, policy=policy, open_paths=open_paths)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(
        CountRequests, metrics=metrics, templates=lambda: list(app.openapi()["paths"])
    )


class SecurityHeaders:
    """SECURITY_HEADERS on every response (they matter for the UI's pages; on the API's
    JSON they cost nothing)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyTooLarge(HTTPException):
    """Raised from `receive` so FastAPI's body parsing turns it into our 413 error object."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413, f"the request body is larger than the server's limit of {limit} bytes"
        )

    def body(self) -> dict[str, object]:
        return error_body(413, str(self.detail), param=None, code="request_too_large")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            # Refuse before reading a byte of it.
            await _send_413(send, BodyTooLarge(self.max_bytes))
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            # Chunked bodies declare no length: count what actually arrives.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:  # raised where no route turned it into a response
            if started:
                raise
            await _send_413(send, exc)


async def _body_too_large(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, BodyTooLarge)
    return JSONResponse(exc.body(), status_code=413, headers={"Connection": "close"})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, exc: BodyTooLarge) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def route_pattern(template: str) -> re.Pattern[str]:
    """/v1/models/{model} → a pattern matching /v1/models/<anything but a slash>."""
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("".join("[^/]+" if p[:1] == "{" else re.escape(p) for p in parts) + "$")


class CountRequests:
    """llama_srb_http_requests_total{route, method, status}, labelled by the API's path
    templates (the UI's files and unknown paths: "other"), never by the raw path, so
    scanners cannot blow up the label set."""

    def __init__(
        self, app: ASGIApp, metrics: ServerMetrics, templates: Callable[[], list[str]]
    ) -> None:
        self.app = app
        self.metrics = metrics
        self._templates = templates
        self._routes: list[tuple[re.Pattern[str], str]] | None = None

    def _label(self, path: str) -> str:
        if self._routes is None:  # on first use: every route is registered by then
            self._routes = [(route_pattern(t), t) for t in self._templates()]
        return next((t for pattern, t in self._routes if pattern.match(path)), "other")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app fails before it responds

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            label = self._label(scope["path"])
            self.metrics.http_requests.labels(label, scope["method"], str(status)).inc()

"""API keys: `Authorization: Bearer <key>` on everything but /health, /metrics and the UI.

Checked in ASGI middleware, before a byte of the body is read or parsed: a client without
a key learns nothing but that it needs one (not whether its JSON was valid).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from llama_srb.api.errors import body_for
from llama_srb.config import Settings

_UNAUTHORIZED = "missing or wrong API key: send `Authorization: Bearer <key>`"


class ApiKeys:
    """The accepted keys (--api-key and --api-key-file), read once at startup."""

    def __init__(self, settings: Settings) -> None:
        self._keys = [key.encode() for key in settings.api_keys()]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def accepts(self, supplied: bytes) -> bool:
        # Compare with every key, in constant time each, and never stop early: the time
        # taken says nothing about how much of which key matched.
        matched = False
        for key in self._keys:
            matched |= secrets.compare_digest(supplied, key)
        return matched

    def authorized(self, scope: Scope) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and self.accepts(token.strip())


class RequireKey:
    """401 in OpenAI's error shape for any path outside `open_paths` without a valid key."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, open_paths: Collection[str]) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self.open_paths
            or self.keys.authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            body_for(scope["path"], 401, _UNAUTHORIZED, code="invalid_api_key")
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

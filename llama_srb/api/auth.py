"""API keys: `Authorization: Bearer <key>` (or TabbyAPI's `x-api-key` / `x-admin-key`) on
everything but /health, /metrics and the UI.

Checked in ASGI middleware, before a byte of the body is read or parsed: a client without
a key learns nothing but that it needs one (not whether its JSON was valid). The matched
key's label (its name, else `key-<position>`) and whether it is an admin's go into the
request's scope for the request log, the metrics, fair share and the library's owners
(api/clients.py); the key itself never does.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from llama_srb.api.errors import body_for
from llama_srb.config import Settings

log = logging.getLogger(__name__)

_UNAUTHORIZED = "missing or wrong API key: send `Authorization: Bearer <key>`"
KEY_LABEL = "llama_srb_key"  # the scope["state"] entry that holds the matched key's label
KEY_ADMIN = "llama_srb_admin"  # ... and whether that key is an admin's


class ApiKeys:
    """The accepted keys (--api-key and --api-key-file), read once at startup."""

    def __init__(self, settings: Settings) -> None:
        keys = settings.api_keys()
        self._keys = [k.key.encode() for k in keys]
        self.labels = [k.name or f"key-{i}" for i, k in enumerate(keys, 1)]
        self.admins = [k.admin for k in keys]
        if keys:  # who is who, once: an `admin:` line that was meant otherwise shows here
            admins = sorted({n for n, a in zip(self.labels, self.admins, strict=True) if a})
            writers = sorted(set(self.labels) - set(admins))
            log.info("API keys of writers: %s; of admins: %s", writers or "none", admins or "none")

    @property
    def required(self) -> bool:
        return bool(self._keys)

    @property
    def several(self) -> bool:
        """Whether keys tell writers apart (then a key's label is its client)."""
        return len(set(self.labels)) > 1

    def _match(self, supplied: bytes) -> int:
        """The index of the key supplied, or -1 if it is not one of ours."""
        # Compare with every key, in constant time each, and never stop early: the time
        # taken says nothing about how much of which key matched.
        matched = -1
        for index, key in enumerate(self._keys):
            if secrets.compare_digest(supplied, key):
                matched = index
        return matched

    def label(self, supplied: bytes) -> str | None:
        """The label of the key supplied, or None if it is not one of ours."""
        matched = self._match(supplied)
        return self.labels[matched] if matched >= 0 else None

    def accepts(self, supplied: bytes) -> bool:
        return self.label(supplied) is not None

    def identify(self, scope: Scope) -> tuple[str, bool] | None:
        """The label of the request's bearer key and whether it is an admin's, if it is
        one of ours."""
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":  # TabbyAPI's clients' headers (SillyTavern sends both)
            token = headers.get(b"x-api-key") or headers.get(b"x-admin-key") or b""
        matched = self._match(token.strip()) if token else -1
        return (self.labels[matched], self.admins[matched]) if matched >= 0 else None


class RequireKey:
    """401 in OpenAI's error shape for any path outside `open_paths` without a valid key."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, open_paths: Collection[str]) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = self.keys.identify(scope)
        if key is not None:
            state = scope.setdefault("state", {})
            state[KEY_LABEL], state[KEY_ADMIN] = key
        if key is not None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            body_for(scope["path"], 401, _UNAUTHORIZED, code="invalid_api_key")
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

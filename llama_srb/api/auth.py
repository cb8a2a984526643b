"""API keys: `Authorization: Bearer <key>` on the /v1 routes when keys are configured."""

from __future__ import annotations

import secrets

from fastapi import Request

from llama_srb.api.errors import APIError
from llama_srb.config import Settings


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

    def check(self, http: Request) -> None:
        """Raise a 401 in OpenAI's error shape unless the request carries an accepted key."""
        if not self._keys:
            return
        scheme, _, token = http.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not self.accepts(token.strip().encode()):
            raise APIError(
                401,
                "missing or wrong API key: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

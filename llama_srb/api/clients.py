"""Who sent a request: the unit of fair share and of the per-client limits.

The same keys deploy/nginx.conf hashes on, in this order: the API key's name when keys
tell writers apart (several keys), else the X-Session-Id header (the UI sends one per
story tree), else the client's address (the proxy's own unless it is trusted:
--trusted-proxies). Without keys a client names itself, so the per-client limits bound a
client that plays fair; keys make them binding.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from llama_srb.api.auth import KEY_LABEL, ApiKeys

SESSION_HEADER = "x-session-id"
MAX_SESSION_CHARS = 64  # a UI session id is 8 hex digits; longer ones are cut, not refused


@dataclass(frozen=True)
class Caller:
    client: str  # the unit of fair share: `key:<label>`, `session:<id>` or `address:<ip>`
    key: str | None  # the label of the API key it carried (a bounded set: metrics label)


def caller_of(http: Request, keys: ApiKeys) -> Caller:
    label = http.scope.get("state", {}).get(KEY_LABEL)  # put there by auth.RequireKey
    key = label if isinstance(label, str) else None
    if key is not None and keys.several:
        return Caller(f"key:{key}", key)
    session = http.headers.get(SESSION_HEADER, "").strip()
    if session:
        return Caller(f"session:{session[:MAX_SESSION_CHARS]}", key)
    return Caller(f"address:{http.client.host if http.client else '?'}", key)

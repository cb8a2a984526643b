"""Who sent a request: the client of fair share and of the per-client limits, whose
generations and stories are its own.

The API key's name when keys tell writers apart (several keys); else the client's address
(the forwarded one behind a proxy listed in --trusted-proxies), and within it the
X-Session-Id header (the UI sends one per story tree) when there is one:
`address:1.2.3.4/session:abc`. A session divides its address's share (engine/share.py),
so a client that sends ten session ids gets what one does.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from llama_srb.api.auth import KEY_ADMIN, KEY_LABEL, ApiKeys
from llama_srb.api.errors import APIError
from llama_srb.engine.spec import SESSION_OF
from llama_srb.stories.owners import LOCAL, Access

Owner = tuple[str, ...]  # whose a generation is (generation_owner)
SESSION_HEADER = "x-session-id"
MAX_SESSION_CHARS = 64  # a UI session id is 8 hex digits; longer ones are cut, not refused


@dataclass(frozen=True)
class Caller:
    client: str  # fair share's: `key:<label>`, `address:<ip>` or `address:<ip>/session:<id>`
    key: str | None  # the label of the API key it carried (a bounded set: metrics label)


def caller_of(http: Request, keys: ApiKeys) -> Caller:
    label = http.scope.get("state", {}).get(KEY_LABEL)  # put there by auth.RequireKey
    key = label if isinstance(label, str) else None
    if key is not None and keys.several:
        return Caller(f"key:{key}", key)
    address = f"address:{http.client.host if http.client else '?'}"
    session = http.headers.get(SESSION_HEADER, "").strip()
    if session:
        return Caller(f"{address}{SESSION_OF}session:{session[:MAX_SESSION_CHARS]}", key)
    return Caller(address, key)


def library_access(http: Request, keys: ApiKeys) -> Access:
    """Whose stories a request may see and change (stories/owners.py): its key's name's,
    or every writer's with an admin key or when the keys name one writer only; without
    keys, the local writer's, which is the whole library."""
    state = http.scope.get("state", {})
    label = state.get(KEY_LABEL)  # put there by auth.RequireKey
    if not keys.required:
        return Access(LOCAL, admin=True)
    if not isinstance(label, str):  # RequireKey let it through: never for the library
        raise APIError(401, "the story library needs an API key", code="invalid_api_key")
    return Access(label, admin=bool(state.get(KEY_ADMIN)) or not keys.several)


def generation_owner(http: Request) -> Owner:
    """Whose a running generation is, for the routes that find one by a key the client
    chose (KoboldCpp's genkey): its API key's name; without keys, its address and page
    origin (a script and a file page on one machine are two owners)."""
    label = http.scope.get("state", {}).get(KEY_LABEL)
    if isinstance(label, str):
        return ("key", label)
    host = http.client.host if http.client else "?"
    return ("address", host, http.headers.get("origin", ""))

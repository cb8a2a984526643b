"""Which web pages may call the API from a browser (CORS), and the refusal of the rest.

The server listens on loopback by default, without a key, and any page a writer opens can
send it requests: a "simple" POST (no preflight, its answer unreadable) still generates,
or stops a generation. So the browser's `Origin` header is checked on every request, not
only answered with CORS headers, and a page that may not call the API gets a 403 before
anything runs. A request without `Origin` is no page's (curl, the SDKs, SillyTavern's
server): it passes, and --api-key is what guards it.

May call the API: the server's own pages (same origin), the origins --cors-origins names,
and by default `null` and `loopback`:
- `null`: pages opened as files (Mikupad's and KoboldAI Lite's single HTML files). A
  sandboxed frame of any web site sends `Origin: null` too, and nothing tells the two
  apart: the price of file pages working out of the box (docs/production.md, "Browser pages").
- `loopback`: pages served from this machine, http(s)://localhost, 127.0.0.0/8 or [::1],
  any port (SillyTavern's page, a local Mikupad server).
With --api-key, any page may send requests that need the key: the key is checked for
every origin, and a page without it gets the 401. Paths open without a key (/health,
/metrics, the UI's files) keep the origin rules.

The story library (/v1/stories) holds a writer's novels: read, changed or deleted by a
page it would be lost. So only the server's own pages, and the sites --library-origins
names, may call it from a browser, whatever --cors-origins allows and with or without a
key (and a request without Origin whose Sec-Fetch-Site says another page sent it is
refused too); Mikupad and KoboldAI Lite never call it.

Chrome's Private Network Access preflight (`Access-Control-Request-Private-Network`,
for a page on a public address calling this one) is answered for the pages allowed.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llama_srb.api.errors import body_for

NULL = "null"
LOOPBACK = "loopback"
ANY = "*"
NONE = "none"  # --cors-origins none: same origin only
PREFLIGHT_MAX_AGE = "600"
ALLOWED_METHODS = "GET, POST, OPTIONS"
LIBRARY = "/v1/stories"  # the story library's routes
LIBRARY_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
EXPOSED_HEADERS = "Retry-After, X-Genkey"  # a 429's wait, a KoboldCpp genkey made here


@dataclass(frozen=True)
class OriginPolicy:
    origins: frozenset[str]  # exact origins, lower-case ("null" among them)
    loopback: bool
    any_origin: bool
    keyed: bool  # the server requires an API key
    library: frozenset[str] = frozenset()  # other sites that may use the story library

    @classmethod
    def of(cls, listed: Sequence[str], keyed: bool, library: Sequence[str] = ()) -> OriginPolicy:
        """From --cors-origins' entries (origins and the words null, loopback, *, none)
        and --library-origins' (origins only)."""
        entries = {entry.strip().lower().rstrip("/") for entry in listed} - {NONE, ""}
        return cls(
            origins=frozenset(entries - {LOOPBACK, ANY}),
            loopback=LOOPBACK in entries,
            any_origin=ANY in entries,
            keyed=keyed,
            library=frozenset(entry.strip().lower().rstrip("/") for entry in library),
        )

    def allows(self, origin: str, host: str | None, needs_key: bool) -> bool:
        """May a page of `origin` call a path on this server (reached as `host`)? With a
        key required (`needs_key`: the path is not open), any page may: it needs the key."""
        origin = origin.strip().lower()
        if self.any_origin or origin in self.origins or (self.keyed and needs_key):
            return True
        if host is not None and _netloc(origin) == host.lower():
            return True  # the server's own pages
        return self.loopback and is_loopback(origin)

    def allows_library(self, origin: str, host: str | None) -> bool:
        """May a page of `origin` use the story library? Only the server's own pages and
        the sites --library-origins names: never `null`, nor every local page."""
        origin = origin.strip().lower()
        return origin in self.library or (host is not None and _netloc(origin) == host.lower())


def _from_another_page(headers: Headers) -> bool:
    """A browser says the request comes from a page of another origin (`same-site` is
    another port of the same host: another origin too)."""
    return headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site")


def is_library(path: str) -> bool:
    return path == LIBRARY or path.startswith(LIBRARY + "/")


def _netloc(origin: str) -> str | None:
    parts = urlsplit(origin)
    return parts.netloc if parts.scheme in ("http", "https") else None


def is_loopback(origin: str) -> bool:
    """http(s)://localhost, *.localhost, 127.0.0.0/8 or [::1], on any port."""
    parts = urlsplit(origin)
    try:
        host, _ = parts.hostname, parts.port  # .port raises on a port that is no number
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OriginGate:
    """Pure ASGI: answers preflights, adds CORS headers to the answers for allowed pages,
    and refuses every request of a page that may not call the API (403)."""

    def __init__(
        self, app: ASGIApp, policy: OriginPolicy, open_paths: Collection[str] = ()
    ) -> None:
        self.app = app
        self.policy = policy
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        path, host = scope["path"], headers.get("host")
        library = is_library(path)
        if origin is None and library and _from_another_page(headers):
            # A browser's no-cors GET (an <img>, a <script>) carries no Origin: its
            # Sec-Fetch-Site still says it comes from another page.
            await _refuse(send, "", path, library)
            return
        if origin is None:
            await self.app(scope, receive, send)
            return
        if library:
            allowed = self.policy.allows_library(origin, host)
        else:
            allowed = self.policy.allows(origin, host, needs_key=path not in self.open_paths)
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        if not allowed:
            await _refuse(send, origin, path, library)
        elif preflight:
            await _preflight(send, origin, headers, LIBRARY_METHODS if library else ALLOWED_METHODS)
        else:
            await self.app(scope, receive, _with_cors(send, origin))


def _cors_headers(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": EXPOSED_HEADERS,
        "Vary": "Origin",
    }


def _with_cors(send: Send, origin: str) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in _cors_headers(origin).items():
                if name == "Vary":
                    headers.add_vary_header(value)
                else:
                    headers[name] = value
        await send(message)

    return sending


async def _preflight(send: Send, origin: str, request: Headers, methods: str) -> None:
    headers = {
        **_cors_headers(origin),
        "Access-Control-Allow-Methods": methods,
        "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
        "Vary": "Origin, Access-Control-Request-Headers, Access-Control-Request-Private-Network",
    }
    asked = request.get("access-control-request-headers")
    if asked:  # any header the page wants to send (the key travels in Authorization)
        headers["Access-Control-Allow-Headers"] = asked
    if request.get("access-control-request-private-network", "").lower() == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": 204, "headers": raw})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Send, origin: str, path: str, library: bool) -> None:
    message = (
        f"pages from {origin[:200]} may not call this server: start it with"
        " --cors-origins naming that origin, or with --api-key and send the key"
    )
    if library:
        message = (
            f"pages from {origin[:200] or 'another site'} may not use the story library: only"
            " the server's own pages may, and the sites --library-origins names (a key does"
            " not change that)"
        )
    body = json.dumps(body_for(path, 403, message, code="origin_not_allowed")).encode()
    headers = [(b"content-type", b"application/json"), (b"vary", b"Origin")]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})

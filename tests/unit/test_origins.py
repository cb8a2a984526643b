"""Which web pages may call the API (api/origins.py): the policy, and the gate in front of
a small app, spoken to as browsers speak (Origin, preflights, Chrome's Private Network
Access header). The real server and chromium: tests/integration/test_mikupad.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llama_srb.api.origins import OriginGate, OriginPolicy, is_loopback
from llama_srb.config import Settings

DEFAULT = OriginPolicy.of(Settings.model_fields["cors_origins"].default, keyed=False)
FOREIGN = "https://stories.example"


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost:8000",
        "http://localhost",
        "https://app.localhost:3000",
        "http://127.0.0.1:5001",
        "http://127.4.5.6",
        "http://[::1]:9090",
    ],
)
def test_loopback_origins(origin: str) -> None:
    assert is_loopback(origin)
    assert DEFAULT.allows(origin, "127.0.0.1:9090", needs_key=True)


@pytest.mark.parametrize(
    "origin",
    [
        FOREIGN,
        "http://localhost.example.com",
        "http://127.0.0.1.nip.io",
        "http://192.168.1.5:9090",
        "file://",
        "chrome-extension://abcdef",
        "http://localhost:notaport",
    ],
)
def test_other_origins_are_not_loopback(origin: str) -> None:
    assert not is_loopback(origin)
    assert not DEFAULT.allows(origin, "127.0.0.1:9090", needs_key=True)


def test_file_pages_and_the_servers_own_pages() -> None:
    assert DEFAULT.allows("null", "127.0.0.1:9090", needs_key=True)
    # the UI opened on the LAN address: its own origin
    assert DEFAULT.allows("http://192.168.1.5:9090", "192.168.1.5:9090", needs_key=True)


def test_listed_origins_and_the_words() -> None:
    listed = OriginPolicy.of(["https://Stories.example/", "loopback"], keyed=False)
    assert listed.allows(FOREIGN, None, needs_key=True)
    assert not listed.allows("null", None, needs_key=True)  # `null` no longer listed
    assert OriginPolicy.of(["*"], keyed=False).allows("https://any.example", None, True)
    only_own = OriginPolicy.of(["none"], keyed=False)
    assert not only_own.allows("null", None, True)
    assert not only_own.allows("http://localhost:3000", None, True)


def test_with_a_key_any_page_may_try_paths_that_need_it() -> None:
    keyed = OriginPolicy.of(["null", "loopback"], keyed=True)
    assert keyed.allows(FOREIGN, "127.0.0.1:9090", needs_key=True)
    assert not keyed.allows(FOREIGN, "127.0.0.1:9090", needs_key=False)  # /metrics, the UI


# -- the gate in front of an app ----------------------------------------------------------


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"ran": True}, headers={"Vary": "Accept-Encoding"})


def _gate(policy: OriginPolicy) -> OriginGate:
    every = ["GET", "POST", "PATCH", "DELETE"]
    app = Starlette(
        routes=[
            Route("/v1/x", _echo, methods=["GET", "POST"]),
            Route("/v1/stories", _echo, methods=every),
            Route("/v1/stories/{sid}", _echo, methods=every),
        ]
    )
    return OriginGate(app, policy, open_paths={"/metrics"})


def _call(
    policy: OriginPolicy, method: str, headers: dict[str, str], path: str = "/v1/x"
) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=_gate(policy))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9090") as c:
            return await c.request(method, path, headers=headers, content=b"{}")

    return asyncio.run(go())


@pytest.mark.parametrize("origin", ["null", "http://localhost:8000"])
def test_an_allowed_page_gets_its_answer_with_cors_headers(origin: str) -> None:
    response = _call(DEFAULT, "POST", {"Origin": origin, "Content-Type": "application/json"})
    assert response.status_code == 200 and response.json() == {"ran": True}
    assert response.headers["access-control-allow-origin"] == origin
    assert "Origin" in response.headers["vary"] and "Accept-Encoding" in response.headers["vary"]


def test_a_preflight_is_answered_with_what_the_page_asked_for() -> None:
    response = _call(
        DEFAULT,
        "OPTIONS",
        {
            "Origin": "null",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == "null"
    assert response.headers["access-control-allow-headers"] == "authorization,content-type"
    assert "POST" in response.headers["access-control-allow-methods"]
    assert response.headers["access-control-allow-private-network"] == "true"


def test_no_private_network_grant_unless_asked() -> None:
    response = _call(DEFAULT, "OPTIONS", {"Origin": "null", "Access-Control-Request-Method": "GET"})
    assert response.status_code == 204
    assert "access-control-allow-private-network" not in response.headers


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_another_sites_page_is_refused_before_anything_runs(method: str) -> None:
    """A form or no-cors POST needs no preflight: refusing only the CORS headers would
    still have run it."""
    response = _call(DEFAULT, method, {"Origin": FOREIGN, "Content-Type": "text/plain"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "origin_not_allowed"
    assert "--cors-origins" in response.json()["error"]["message"]
    assert "access-control-allow-origin" not in response.headers


def test_another_sites_preflight_is_refused() -> None:
    response = _call(
        DEFAULT,
        "OPTIONS",
        {
            "Origin": FOREIGN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers
    assert "access-control-allow-private-network" not in response.headers


def test_requests_without_origin_pass() -> None:
    assert _call(DEFAULT, "POST", {}).json() == {"ran": True}


LIBRARY_PATHS = [
    ("GET", "/v1/stories"),
    ("PATCH", "/v1/stories/abcdefgh12"),
    ("DELETE", "/v1/stories/abcdefgh12"),
]


@pytest.mark.parametrize(
    "policy",
    [
        DEFAULT,
        OriginPolicy.of(["*"], keyed=False),
        OriginPolicy.of(["null", "loopback", FOREIGN], keyed=True),
    ],
    ids=["default", "any page", "keyed, listed"],
)
@pytest.mark.parametrize("origin", ["null", "http://localhost:8000", FOREIGN])
@pytest.mark.parametrize(("method", "path"), LIBRARY_PATHS)
def test_the_library_refuses_other_pages_whatever_cors_origins_says(
    policy: OriginPolicy, origin: str, method: str, path: str
) -> None:
    """A sandboxed frame (`null`), a local page, a site --cors-origins lets generate: none
    may read or change the stories, with or without a key."""
    response = _call(policy, method, {"Origin": origin}, path)
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "origin_not_allowed" and "--library-origins" in error["message"]
    assert "access-control-allow-origin" not in response.headers
    preflight = {"Origin": origin, "Access-Control-Request-Method": method}
    assert _call(policy, "OPTIONS", preflight, path).status_code == 403


def test_the_library_answers_its_own_pages_listed_sites_and_no_page() -> None:
    own = {"Origin": "http://127.0.0.1:9090"}
    assert _call(DEFAULT, "PATCH", own, "/v1/stories/abcdefgh12").json() == {"ran": True}
    assert _call(DEFAULT, "GET", {}, "/v1/stories").json() == {"ran": True}  # curl, an SDK
    listed = OriginPolicy.of(["null"], keyed=False, library=["https://notes.example"])
    site = {"Origin": "https://notes.example", "Access-Control-Request-Method": "PATCH"}
    preflight = _call(listed, "OPTIONS", site, "/v1/stories/abcdefgh12")
    assert (
        preflight.status_code == 204
        and "PATCH" in preflight.headers["access-control-allow-methods"]
    )
    assert _call(listed, "GET", {"Origin": "null"}, "/v1/stories").status_code == 403
    # Generation's preflight offers what generation uses, not the library's methods.
    other = _call(DEFAULT, "OPTIONS", {"Origin": "null", "Access-Control-Request-Method": "POST"})
    assert "PATCH" not in other.headers["access-control-allow-methods"]


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_no_cors_read_from_another_page_is_refused_though_it_has_no_origin(site: str) -> None:
    """An <img> or <script> of another page sends no Origin; Sec-Fetch-Site tells."""
    response = _call(DEFAULT, "GET", {"Sec-Fetch-Site": site}, "/v1/stories")
    assert response.status_code == 403 and "story library" in response.json()["error"]["message"]
    for own in ("same-origin", "none"):  # the UI's own fetch, an address typed in
        assert _call(DEFAULT, "GET", {"Sec-Fetch-Site": own}, "/v1/stories").status_code == 200
    assert _call(DEFAULT, "GET", {"Sec-Fetch-Site": site}).status_code == 200  # not the library


@pytest.mark.parametrize("origin", ["null", "loopback", "*", "https://notes.example/path", "x"])
def test_library_origins_are_named_sites_only(origin: str) -> None:
    with pytest.raises(ValueError, match="library_origins"):
        Settings(library_origins=[origin])
    assert Settings(library_origins=["https://Notes.example:8443/"]).library_origins == [
        "https://notes.example:8443"
    ]

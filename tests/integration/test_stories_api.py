"""The story library through the real server (issue 30): the API key gates it, bad input
(huge bodies, deep JSON, bad JSON, unknown ids, path tricks) gets a 4xx and leaves the
store as it was, two writers on one revision merge or get a 409 naming the clash, and a
server killed with SIGKILL mid-edit loses no write it confirmed. Issue 38: each writer's
stories are theirs (another key's name gets a 404, an admin key sees all), no page of
another origin reaches them, and no client can fill the library or stall it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server import RunningServer, run_server

KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
STORY = "The lighthouse keeper found a letter on the rocks."
MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("stories")
    args = ("--api-key", KEY, "--n-ctx", "1024", "--max-body-bytes", str(MAX_BODY))
    with run_server(tmp, *args) as running:
        yield running


def call(server: RunningServer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {**AUTH, **kwargs.pop("headers", {})}
    return httpx.request(method, f"{server.api_url}{path}", headers=headers, timeout=60, **kwargs)


def make(server: RunningServer, **draft: Any) -> dict[str, Any]:
    draft.setdefault("nodes", [{"id": 1, "text": STORY}])
    response = call(server, "POST", "/stories", json=draft)
    assert response.status_code == 201, response.text
    return response.json()


def test_the_api_key_gates_every_story_route(keyed: RunningServer) -> None:
    sid = make(keyed)["id"]
    routes = [
        ("GET", "/stories"),
        ("POST", "/stories"),
        ("GET", f"/stories/{sid}"),
        ("PATCH", f"/stories/{sid}"),
        ("DELETE", f"/stories/{sid}"),
        ("POST", f"/stories/{sid}/restore"),
        ("POST", f"/stories/{sid}/duplicate"),
        ("POST", f"/stories/{sid}/owner"),
        ("DELETE", "/stories/trash"),
    ]
    for method, path in routes:
        response = httpx.request(method, f"{keyed.api_url}{path}", json={}, timeout=30)
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert call(keyed, "GET", f"/stories/{sid}").json()["nodes"][0]["text"] == STORY


def test_a_story_is_made_listed_written_duplicated_deleted_and_restored(
    keyed: RunningServer,
) -> None:
    story = make(keyed, name="The Letter", context={"memory": "Maine, 1890."})
    sid = story["id"]
    listed = {s["id"]: s for s in call(keyed, "GET", "/stories").json()["data"]}
    assert listed[sid]["name"] == "The Letter" and listed[sid]["words"] == 9
    assert listed[sid]["opened"] and listed[sid]["node_count"] == 1

    read = call(keyed, "GET", f"/stories/{sid}")
    assert read.headers["etag"] == '"1"' and read.json()["context"]["memory"] == "Maine, 1890."
    patch = {
        "base_revision": 1,
        "name": "Letters",
        "nodes": [{"id": 2, "parent": 1, "text": STORY + " Come."}],
    }
    written = call(keyed, "PATCH", f"/stories/{sid}", json=patch)
    assert written.status_code == 200 and written.json()["revision"] == 2
    assert written.headers["etag"] == '"2"'
    since = call(keyed, "GET", f"/stories/{sid}", params={"since": 1}).json()
    assert [n["id"] for n in since["nodes"]] == [2] and since["fields"] == {"name": "Letters"}

    copy = call(keyed, "POST", f"/stories/{sid}/duplicate", json={"name": "Letters, again"})
    assert copy.status_code == 201 and copy.json()["node_count"] == 2
    assert call(keyed, "DELETE", f"/stories/{sid}").json()["deleted"] is True
    gone = call(keyed, "GET", f"/stories/{sid}")
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "story_deleted"
    assert sid not in {s["id"] for s in call(keyed, "GET", "/stories").json()["data"]}
    assert call(keyed, "POST", f"/stories/{sid}/restore").json()["name"] == "Letters"
    assert len(call(keyed, "GET", f"/stories/{sid}").json()["nodes"]) == 2


def test_two_writers_on_one_revision_merge_and_a_clash_is_a_409(keyed: RunningServer) -> None:
    sid = make(keyed, nodes=[{"id": 1, "text": STORY, "choices": [{"text": " Come."}]}])["id"]
    a = call(
        keyed,
        "PATCH",
        f"/stories/{sid}",
        json={
            "base_revision": 1,
            "nodes": [{"id": 2, "parent": 1, "via": 0, "text": STORY + " Come."}],
        },
    )
    b = call(
        keyed,
        "PATCH",
        f"/stories/{sid}",
        json={"base_revision": 1, "nodes": [{"id": 2, "parent": 1, "text": STORY + " Go."}]},
    )
    assert a.json()["renumbered"] == {} and b.json()["renumbered"] == {"2": 3}
    texts = {n["id"]: n["text"] for n in call(keyed, "GET", f"/stories/{sid}").json()["nodes"]}
    assert texts == {1: STORY, 2: STORY + " Come.", 3: STORY + " Go."}

    edit = {"base_revision": 3, "nodes": [{"id": 1, "choices": [{"text": " Come home."}]}]}
    assert call(keyed, "PATCH", f"/stories/{sid}", json=edit).status_code == 200
    clash = {"base_revision": 3, "nodes": [{"id": 1, "choices": [{"text": " Stay."}]}]}
    refused = call(keyed, "PATCH", f"/stories/{sid}", json=clash)
    assert refused.status_code == 409
    body = refused.json()
    assert body["error"]["code"] == "story_conflict"
    assert body["conflicts"] == [{"kind": "changed", "node": 1, "field": "choices"}]
    assert body["changes"]["nodes"][0]["choices"][0]["text"] == " Come home."


def bad_requests(sid: str) -> list[tuple[str, str, dict[str, Any], int]]:
    deep = "[" * 3000 + "]" * 3000
    many = [{"id": i, "text": "x"} for i in range(1, 10_002)]
    return [
        ("POST", "/stories", {"content": b"{not json"}, 400),
        ("PATCH", f"/stories/{sid}", {"content": b'{"base_revision": 1, "nodes": ['}, 400),
        ("POST", "/stories", {"content": b"x" * (MAX_BODY + 1)}, 413),
        (
            "PATCH",
            f"/stories/{sid}",
            {"json": {"base_revision": 1, "nodes": [{"id": 1, "text": "x" * MAX_BODY}]}},
            413,
        ),
        (
            "PATCH",
            f"/stories/{sid}",
            {"content": f'{{"base_revision":1,"settings":{{"x":{deep}}}}}'.encode()},
            400,
        ),
        ("POST", "/stories", {"json": {"nodes": many}}, 400),
        ("POST", "/stories", {"json": {"nodes": [{"id": 1, "text": "a", "parent": 1}]}}, 400),
        ("POST", "/stories", {"json": {"id": "../../etc/passwd"}}, 400),
        ("POST", "/stories", {"json": {"name": "a\u0000b"}}, 400),
        ("PATCH", f"/stories/{sid}", {"json": {"base_revision": 99}}, 400),
        ("PATCH", f"/stories/{sid}", {"json": {"base_revision": 1, "deleted": [1]}}, 400),
        ("PATCH", f"/stories/{sid}", {"json": {"nodes": []}}, 400),
        ("PATCH", f"/stories/{sid}", {"json": []}, 400),
        ("GET", f"/stories/{sid}?since=-1", {}, 400),
        ("GET", f"/stories/{sid}?since=5", {}, 400),
        ("GET", "/stories/no-such-story", {}, 404),
        ("PATCH", "/stories/no-such-story", {"json": {"base_revision": 1}}, 404),
        ("DELETE", "/stories/no-such-story", {}, 404),
        ("GET", "/stories/short", {}, 400),
        ("GET", "/stories/..%2F..%2Fstories.sqlite3", {}, 404),
        ("GET", "/stories/%2e%2e", {}, 400),
        ("GET", "/stories/" + "a" * 65, {}, 400),
    ]


def test_bad_input_gets_a_4xx_and_leaves_the_store_as_it_was(keyed: RunningServer) -> None:
    sid = make(
        keyed, nodes=[{"id": 1, "text": STORY}, {"id": 2, "parent": 1, "text": STORY + "!"}]
    )["id"]
    library = call(keyed, "GET", "/stories").json()["data"]
    before = call(keyed, "GET", f"/stories/{sid}").json()
    for method, path, kwargs, status in bad_requests(sid):
        response = call(keyed, method, path, **kwargs)
        assert response.status_code == status, (method, path, response.text[:300])
        error = response.json()["error"]
        assert error["message"] and error["type"], (method, path)
    after = call(keyed, "GET", f"/stories/{sid}").json()
    assert after["nodes"] == before["nodes"] and after["revision"] == before["revision"]
    assert [s["id"] for s in call(keyed, "GET", "/stories").json()["data"]] == [
        s["id"] for s in library
    ]
    assert httpx.get(f"{keyed.base_url}/health", timeout=10).status_code == 200


def test_a_server_killed_mid_edit_loses_nothing_it_confirmed(tmp_path: Path) -> None:
    """Writes stream in from a thread while the server is killed with SIGKILL; the server
    started again on the same data folder has every write that got its 200, and SQLite
    finds its file whole."""
    data = tmp_path / "data"
    args = ("--data-dir", str(data), "--n-ctx", "512")
    confirmed: list[int] = []
    with run_server(tmp_path, *args) as first:
        sid = make(first)["id"]
        stop = threading.Event()

        def writer() -> None:
            revision = 1
            with httpx.Client(base_url=first.api_url, headers=AUTH, timeout=10) as client:
                for i in range(2, 100_000):
                    text = STORY + " Again." * i
                    patch = {
                        "base_revision": revision,
                        "nodes": [{"id": i, "parent": i - 1, "text": text}],
                    }
                    try:
                        response = client.patch(f"/stories/{sid}", json=patch)
                    except httpx.TransportError:
                        return  # the server is gone
                    assert response.status_code == 200, response.text
                    revision = response.json()["revision"]
                    confirmed.append(i)
                    if stop.is_set():
                        return

        thread = threading.Thread(target=writer)
        thread.start()
        while len(confirmed) < 30:
            thread.join(0.05)
        os.kill(first.process.pid, signal.SIGKILL)  # while the writer is mid-request
        stop.set()
        thread.join()
        first.process.wait()
    assert first.process.returncode == -signal.SIGKILL

    with sqlite3.connect(data / "stories.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with run_server(tmp_path, *args) as second:
        story = httpx.get(f"{second.api_url}/stories/{sid}", timeout=30).json()
    ids = {n["id"] for n in story["nodes"]}
    assert set(confirmed) <= ids and story["revision"] >= len(confirmed) + 1
    assert ids == set(range(1, story["revision"] + 1))  # at most one more: it committed, unheard
    assert json.dumps(story)  # readable whole


# -- issue 38: owners, pages, bounds ------------------------------------------------------

WRITERS = {"alice": "k-alice", "bob": "k-bob", "root": "k-root"}
CREATIONS = 6  # --story-creations: a minute's new stories per writer


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {WRITERS[name]}"}


@pytest.fixture(scope="module")
def writers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("writers")
    keys = ("--api-key", "alice: k-alice", "--api-key", "bob: k-bob")
    args = (*keys, "--api-key", "admin:root: k-root", "--story-creations", str(CREATIONS))
    with run_server(tmp, *args, "--n-ctx", "512") as running:
        yield running


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The default: no key, `--cors-origins null,loopback`."""
    with run_server(tmp_path_factory.mktemp("keyless"), "--n-ctx", "512") as running:
        yield running


def by(server: RunningServer, name: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {**as_(name), **kwargs.pop("headers", {})}
    return httpx.request(method, f"{server.api_url}{path}", headers=headers, timeout=60, **kwargs)


def test_another_writer_gets_a_404_and_changes_nothing(writers: RunningServer) -> None:
    """The issue's requests: Bob lists, reads, overwrites, deletes, restores and copies
    Alice's story; each answer is what an unknown id gets, and her text is as she left it."""
    made = by(writers, "alice", "POST", "/stories", json={"nodes": [{"id": 1, "text": STORY}]})
    sid = made.json()["id"]
    unknown = by(writers, "bob", "GET", "/stories/no-such-story").json()["error"]
    assert sid not in {s["id"] for s in by(writers, "bob", "GET", "/stories").json()["data"]}
    overwrite = {"base_revision": 1, "nodes": [{"id": 1, "text": "bob overwrote it"}]}
    tries = [
        ("GET", f"/stories/{sid}", {}),
        ("GET", f"/stories/{sid}?since=0", {}),
        ("PATCH", f"/stories/{sid}", {"json": overwrite}),
        ("DELETE", f"/stories/{sid}", {}),
        ("POST", f"/stories/{sid}/restore", {}),
        ("POST", f"/stories/{sid}/duplicate", {}),
        ("POST", f"/stories/{sid}/owner", {"json": {"owner": "bob"}}),
    ]
    for method, path, kwargs in tries:
        response = by(writers, "bob", method, path, **kwargs)
        assert response.status_code == 404, (method, path, response.text)
        error = response.json()["error"]
        assert error["code"] == unknown["code"] == "story_not_found"
        assert error["message"] == f"no story with the id {sid!r}"
    story = by(writers, "alice", "GET", f"/stories/{sid}").json()
    assert story["revision"] == 1 and story["nodes"][0]["text"] == STORY
    assert story["owner"] == "alice"


def test_an_admin_key_sees_and_manages_every_story(writers: RunningServer) -> None:
    sid = by(writers, "alice", "POST", "/stories", json={"name": "Alice's"}).json()["id"]
    listed = {s["id"]: s["owner"] for s in by(writers, "root", "GET", "/stories").json()["data"]}
    assert listed[sid] == "alice"
    assert (
        by(
            writers, "root", "PATCH", f"/stories/{sid}", json={"base_revision": 1, "name": "Read"}
        ).status_code
        == 200
    )
    given = by(writers, "root", "POST", f"/stories/{sid}/owner", json={"owner": "bob"})
    assert given.status_code == 200 and given.json()["owner"] == "bob"
    assert by(writers, "alice", "GET", f"/stories/{sid}").status_code == 404
    assert by(writers, "bob", "GET", f"/stories/{sid}").json()["name"] == "Read"
    refused = by(writers, "bob", "POST", f"/stories/{sid}/owner", json={"owner": "alice"})
    assert refused.status_code == 403 and "only an admin" in refused.json()["error"]["message"]
    assert by(writers, "root", "DELETE", f"/stories/{sid}").json()["deleted"] is True
    assert by(writers, "bob", "GET", f"/stories/{sid}").status_code == 410


def test_new_stories_per_writer_are_bounded_with_a_429_and_retry_after(
    writers: RunningServer,
) -> None:
    """One writer's burst of new stories is refused past --story-creations a minute; the
    others' are not, and deleted stories leave room (the trash is emptied on request)."""
    answers = [by(writers, "bob", "POST", "/stories", json={}) for _ in range(CREATIONS + 1)]
    statuses = [a.status_code for a in answers]
    assert statuses[-1] == 429 and statuses.count(201) <= CREATIONS, statuses
    refused = answers[-1]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "too_many_stories"
    assert "--story-creations" in refused.json()["error"]["message"]
    assert by(writers, "alice", "POST", "/stories", json={}).status_code == 201
    for answer in answers:
        if answer.status_code == 201:
            by(writers, "bob", "DELETE", f"/stories/{answer.json()['id']}")
    emptied = by(writers, "bob", "DELETE", "/stories/trash").json()
    assert emptied["object"] == "story.trash" and emptied["purged"] >= CREATIONS - 1
    gone = answers[0].json()["id"]
    assert by(writers, "bob", "POST", f"/stories/{gone}/restore").status_code == 404


@pytest.mark.parametrize("origin", ["null", "http://localhost:8000", "https://evil.example"])
def test_no_page_of_another_origin_reaches_the_library(
    keyless: RunningServer, writers: RunningServer, origin: str
) -> None:
    """`Origin: null` (a sandboxed frame of any site), a local page, another site: 403 on
    every library route and its preflight, keyless or with a key; the server's own pages
    and clients without Origin (curl, SDKs) pass. Generation still answers `null`."""
    sid = make_keyless(keyless)
    for server, auth in ((keyless, {}), (writers, as_("alice"))):
        for method, path in (
            ("GET", "/stories"),
            ("PATCH", f"/stories/{sid}"),
            ("DELETE", f"/stories/{sid}"),
        ):
            headers = {**auth, "Origin": origin}
            response = httpx.request(
                method,
                f"{server.api_url}{path}",
                headers=headers,
                json={"base_revision": 1},
                timeout=30,
            )
            assert response.status_code == 403, (origin, method, path)
            assert "--library-origins" in response.json()["error"]["message"]
            assert "access-control-allow-origin" not in response.headers
            preflight = {"Origin": origin, "Access-Control-Request-Method": method}
            asked = httpx.options(f"{server.api_url}{path}", headers=preflight, timeout=30)
            assert asked.status_code == 403
    assert httpx.get(f"{keyless.api_url}/stories/{sid}", timeout=30).status_code == 200
    own = {"Origin": keyless.base_url}
    assert httpx.get(f"{keyless.api_url}/stories", headers=own, timeout=30).status_code == 200
    models = httpx.get(f"{keyless.api_url}/models", headers={"Origin": "null"}, timeout=30)
    assert models.status_code == 200  # Mikupad's and Lite's file pages still generate


def make_keyless(server: RunningServer) -> str:
    made = httpx.post(
        f"{server.api_url}/stories", json={"nodes": [{"id": 1, "text": STORY}]}, timeout=30
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def test_depth_and_node_count_are_400s_naming_the_limit(keyless: RunningServer) -> None:
    deep = [{"id": i, "parent": i - 1 if i > 1 else None, "text": "x"} for i in range(1, 5_003)]
    refused = httpx.post(f"{keyless.api_url}/stories", json={"nodes": deep}, timeout=60)
    assert refused.status_code == 400 and "at most 5000 deep" in refused.json()["error"]["message"]
    wide = [{"id": 1, "text": "x"}] + [
        {"id": i, "parent": 1, "text": "y"} for i in range(2, 10_001)
    ]
    made = httpx.post(f"{keyless.api_url}/stories", json={"nodes": wide}, timeout=60)
    assert made.status_code == 201 and made.json()["node_count"] == 10_000
    sid = made.json()["id"]
    more = {"base_revision": 1, "nodes": [{"id": 10_001, "parent": 1, "text": "z"}]}
    over = httpx.patch(f"{keyless.api_url}/stories/{sid}", json=more, timeout=60)
    assert over.status_code == 400 and "may have 10000" in over.json()["error"]["message"]

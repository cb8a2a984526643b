"""The story library through the real server (issue 30): the API key gates it, bad input
(huge bodies, deep JSON, bad JSON, unknown ids, path tricks) gets a 4xx and leaves the
store as it was, two writers on one revision merge or get a 409 naming the clash, and a
server killed with SIGKILL mid-edit loses no write it confirmed."""

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

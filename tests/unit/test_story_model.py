"""A story's model (issue 41): the one the writer picked for it, kept with the story in the
library. Optional: a story without one (every story made before) is written by the
server's current model; last-writer-wins like the name; null or "" forgets it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from llama_srb.api.state import AppState
from llama_srb.stories.schema import MAX_MODEL_CHARS, StoryDraft, StoryPatch
from llama_srb.stories.store import StoryStore
from tests.unit.test_story_store import ME, STORY, make, node, write


@pytest.fixture
def store(tmp_path: Path) -> StoryStore:
    return StoryStore(tmp_path / "stories.sqlite3")


def test_a_story_keeps_its_model_and_lists_it(store: StoryStore) -> None:
    story = make(store, model="smollm2-135m-instruct")
    assert story["model"] == "smollm2-135m-instruct"
    assert store.get(story["id"], ME)["model"] == "smollm2-135m-instruct"
    assert [s["model"] for s in store.list(ME)] == ["smollm2-135m-instruct"]
    copy = store.duplicate(story["id"], None, ME)
    assert copy["model"] == "smollm2-135m-instruct"
    assert store.get(copy["id"], ME)["model"] == "smollm2-135m-instruct"


def test_a_story_without_a_model_has_none(store: StoryStore) -> None:
    story = make(store)
    assert story["model"] is None and store.list(ME)[0]["model"] is None
    # A write that does not send it leaves it alone.
    sid = make(store, model="gemma-3-270m")["id"]
    write(store, sid, base_revision=1, name="Renamed")
    assert store.get(sid, ME)["model"] == "gemma-3-270m"


def test_the_model_is_last_writer_wins_and_null_or_empty_forgets_it(store: StoryStore) -> None:
    sid = make(store, nodes=[node(1, STORY)])["id"]
    first = write(store, sid, base_revision=1, model="gemma-3-270m")
    assert first["changes"]["fields"] == {"model": "gemma-3-270m"}
    # Another tab, on the same base: no conflict, the last pick stands.
    second = write(store, sid, base_revision=1, model=" smollm2-135m-instruct ")
    assert second["revision"] == 3
    assert second["changes"]["fields"]["model"] == "smollm2-135m-instruct"
    assert store.get(sid, ME)["model"] == "smollm2-135m-instruct"
    # The same pick again changes nothing (no new revision).
    assert write(store, sid, base_revision=3, model="smollm2-135m-instruct")["revision"] == 3
    # What others see since: the model among the story's fields.
    assert store.changes(sid, 1, ME)["fields"]["model"] == "smollm2-135m-instruct"
    assert "model" not in store.changes(sid, 3, ME)["fields"]
    assert write(store, sid, base_revision=3, model="")["revision"] == 4
    assert store.get(sid, ME)["model"] is None
    write(store, sid, base_revision=4, model="gemma-3-270m")
    write(store, sid, base_revision=5, model=None)
    assert store.get(sid, ME)["model"] is None


def test_bad_model_names_are_refused_before_the_store() -> None:
    for bad in ("x" * (MAX_MODEL_CHARS + 1), "gemma\n", "a\x00b", 7):
        with pytest.raises(ValidationError):
            StoryPatch.model_validate({"base_revision": 1, "model": bad})
        with pytest.raises(ValidationError):
            StoryDraft.model_validate({"model": bad})


def test_stories_stored_before_models_were_picked_read_as_none(tmp_path: Path) -> None:
    """A story whose stored fields predate the model (no `model` key) opens, lists and
    takes a pick; no migration is needed (the fields are one JSON object)."""
    path = tmp_path / "stories.sqlite3"
    store = StoryStore(path)
    sid = make(store)["id"]
    store.close()
    db = sqlite3.connect(path)
    meta = json.loads(db.execute("SELECT meta FROM stories").fetchone()[0])
    del meta["model"]
    db.execute("UPDATE stories SET meta = ?", (json.dumps(meta),))
    db.commit()
    db.close()
    store = StoryStore(path)
    assert store.get(sid, ME)["model"] is None
    assert store.list(ME)[0]["model"] is None
    assert "model" not in store.changes(sid, 0, ME)["fields"]
    write(store, sid, base_revision=1, model="gemma-3-270m")
    assert store.get(sid, ME)["model"] == "gemma-3-270m"


def test_the_routes_take_and_give_the_model(
    app_with_state: tuple[TestClient, AppState], tmp_path: Path
) -> None:
    """/v1/stories in process: made with a model, listed, changed, forgotten; a bad one is
    a 400 naming the field."""
    client, state = app_with_state
    state.stories = StoryStore(tmp_path / "stories.sqlite3")
    made = client.post("/v1/stories", json={"name": "Two models", "model": "smollm2-135m-instruct"})
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    assert made.json()["model"] == "smollm2-135m-instruct"
    assert client.get("/v1/stories").json()["data"][0]["model"] == "smollm2-135m-instruct"
    changed = client.patch(f"/v1/stories/{sid}", json={"base_revision": 1, "model": "gemma-3-270m"})
    assert changed.json()["changes"]["fields"] == {"model": "gemma-3-270m"}
    assert client.get(f"/v1/stories/{sid}").json()["model"] == "gemma-3-270m"
    bad = client.patch(f"/v1/stories/{sid}", json={"base_revision": 2, "model": "a\nb"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
    forgot = client.patch(f"/v1/stories/{sid}", json={"base_revision": 2, "model": None})
    assert forgot.json()["revision"] == 3
    assert client.get(f"/v1/stories/{sid}").json()["model"] is None

"""The story library's store on a real SQLite file (no model): revisions, merged writes
from two writers, conflicts, bounds, bad input that leaves the store as it was, the trash,
and a writer process killed with SIGKILL mid-write."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from llama_srb.stories import merge as merge_module
from llama_srb.stories import rows as rows_module
from llama_srb.stories import store as store_module
from llama_srb.stories.errors import (
    BadStory,
    LibraryFull,
    NotAllowed,
    StoryConflict,
    StoryDeleted,
    StoryExists,
    StoryNotFound,
    StoryTooLarge,
)
from llama_srb.stories.owners import LOCAL, Access
from llama_srb.stories.schema import MAX_NODE_BYTES, TRASH_DAYS, StoryDraft, StoryPatch
from llama_srb.stories.store import StoryStore

STORY = "The lighthouse keeper found a letter on the rocks."
ME = Access("writer")


@pytest.fixture
def store(tmp_path: Path) -> StoryStore:
    return StoryStore(tmp_path / "stories.sqlite3")


def node(node_id: int, text: str, parent: int | None = None, **more: Any) -> dict[str, Any]:
    return {"id": node_id, "parent": parent, "text": text, **more}


def card(text: str) -> dict[str, Any]:
    return {"text": text, "finish_reason": "stop", "tokens": 3, "edited": False}


def make(store: StoryStore, **draft: Any) -> dict[str, Any]:
    draft.setdefault("nodes", [node(1, STORY, choices=[card(" It said: come."), card(" Run.")])])
    return store.create(StoryDraft.model_validate(draft), ME)


def write(store: StoryStore, story_id: str, **patch: Any) -> dict[str, Any]:
    return store.patch(story_id, StoryPatch.model_validate(patch), ME)


def nodes_of(store: StoryStore, story_id: str) -> dict[int, dict[str, Any]]:
    return {n["id"]: n for n in store.get(story_id, ME)["nodes"]}


def test_a_story_is_made_listed_renamed_duplicated_deleted_and_restored(
    store: StoryStore,
) -> None:
    story = make(store, name="Lighthouse", context={"memory": "Maine, 1890.", "note": "[gothic]"})
    assert story["revision"] == 1 and story["words"] == len(STORY.split())
    assert story["context"] == {"memory": "Maine, 1890.", "note": "[gothic]", "depth": 3}
    assert [s["name"] for s in store.list(ME)] == ["Lighthouse"]

    renamed = write(store, story["id"], base_revision=1, name="  The Letter ")
    assert renamed["revision"] == 2 and renamed["changes"]["fields"] == {"name": "The Letter"}
    copy = store.duplicate(story["id"], None, ME)
    assert copy["name"] == "The Letter (copy)" and copy["revision"] == 1
    assert nodes_of(store, copy["id"]) == nodes_of(store, story["id"])
    assert store.get(copy["id"], ME)["context"]["memory"] == "Maine, 1890."
    assert [s["name"] for s in store.list(ME)] == [
        "The Letter (copy)",
        "The Letter",
    ]  # opened last first

    store.delete(story["id"], ME)
    assert [s["id"] for s in store.list(ME)] == [copy["id"]]
    with pytest.raises(StoryDeleted):
        store.get(story["id"], ME)
    assert store.restore(story["id"], ME)["name"] == "The Letter"
    assert nodes_of(store, story["id"])[1]["text"] == STORY

    with pytest.raises(StoryNotFound):
        store.get("no-such-story", ME)
    with pytest.raises(StoryExists):
        make(store, id=story["id"])


def test_every_change_raises_the_revision_and_an_empty_write_reads_the_changes(
    store: StoryStore,
) -> None:
    sid = make(store)["id"]
    result = write(store, sid, base_revision=1, nodes=[{"id": 1, "bookmarked": True}])
    assert result["revision"] == 2
    assert result["changes"]["nodes"][0]["bookmarked"] is True
    unchanged = write(store, sid, base_revision=2, nodes=[{"id": 1, "bookmarked": True}])
    assert unchanged["revision"] == 2 and unchanged["changes"]["nodes"] == []
    caught_up = write(store, sid, base_revision=1)  # nothing sent: what happened since 1
    assert caught_up["revision"] == 2 and [n["id"] for n in caught_up["changes"]["nodes"]] == [1]
    assert store.changes(sid, 1, ME)["nodes"] == caught_up["changes"]["nodes"]


def test_two_writers_adding_nodes_from_one_revision_both_keep_theirs(store: StoryStore) -> None:
    """Tab A and tab B both saw revision 1 and both made node 2 (and B a node 3 under its
    2): A's write lands first; B's nodes move to free ids, B's references with them."""
    sid = make(store)["id"]
    a = write(store, sid, base_revision=1, nodes=[node(2, STORY + " It said: come.", 1, via=0)])
    assert a["renumbered"] == {}
    b_nodes = [node(2, STORY + " Run.", 1, via=1), node(3, STORY + " Run. Now.", 2, retry_of=2)]
    b = write(store, sid, base_revision=1, nodes=b_nodes, current=3)
    assert b["renumbered"] == {2: 4} and b["revision"] == 3  # 3 was free: it stays
    stored = nodes_of(store, sid)
    assert stored[2]["text"].endswith("come.") and stored[4]["text"].endswith("Run.")
    assert stored[3]["parent"] == 4 and stored[3]["retry_of"] == 4
    assert store.get(sid, ME)["current"] == 3 and store.get(sid, ME)["next_id"] == 5
    # B's answer holds A's node and its own, renumbered: all it needs to catch up.
    assert {n["id"] for n in b["changes"]["nodes"]} == {2, 3, 4}


def test_a_write_sent_again_after_its_answer_was_lost_changes_nothing(store: StoryStore) -> None:
    """The server committed, then died before it answered: the writer sends the same
    patch again, on the same base. Its node is the one stored, not a second copy."""
    sid = make(store)["id"]
    patch = {
        "base_revision": 1,
        "nodes": [node(2, STORY + " Come.", 1)],
        "context": {"note": "[x]"},
    }
    first = write(store, sid, **patch)
    again = write(store, sid, **patch)
    assert first["revision"] == again["revision"] == 2 and again["renumbered"] == {}
    assert set(nodes_of(store, sid)) == {1, 2}


def test_different_fields_of_one_node_merge_and_the_same_field_conflicts(
    store: StoryStore,
) -> None:
    sid = make(store)["id"]
    write(store, sid, base_revision=1, nodes=[{"id": 1, "bookmarked": True}])
    edited = [card(" It said: come home."), card(" Run.")]
    merged = write(store, sid, base_revision=1, nodes=[{"id": 1, "choices": edited}])
    stored = nodes_of(store, sid)[1]
    assert merged["revision"] == 3 and stored["bookmarked"] and stored["choices"] == edited

    # Both change the first card from revision 3: the second write is refused whole.
    write(store, sid, base_revision=3, nodes=[{"id": 1, "choices": [card(" A."), card(" Run.")]}])
    with pytest.raises(StoryConflict) as refused:
        write(
            store,
            sid,
            base_revision=3,
            nodes=[{"id": 1, "choices": [card(" B."), card(" Run.")]}, node(2, STORY + " B.", 1)],
        )
    assert refused.value.conflicts == [{"kind": "changed", "node": 1, "field": "choices"}]
    theirs = refused.value.changes
    assert theirs["since"] == 3 and theirs["revision"] == 4
    assert theirs["nodes"][0]["choices"][0]["text"] == " A."
    assert set(nodes_of(store, sid)) == {1}  # node 2 of the refused write is not there
    # The same value from both sides is no conflict.
    same = write(
        store, sid, base_revision=3, nodes=[{"id": 1, "choices": [card(" A."), card(" Run.")]}]
    )
    assert same["revision"] == 4


def test_deleting_and_changing_one_node_conflict_both_ways(store: StoryStore) -> None:
    nodes = [node(1, STORY), node(2, STORY + " A.", 1), node(3, STORY + " B.", 1)]
    sid = make(store, nodes=nodes)["id"]
    write(store, sid, base_revision=1, deleted=[2])  # rev 2: A deleted node 2
    with pytest.raises(StoryConflict) as changed_there:  # B, from rev 1, edits node 2
        write(store, sid, base_revision=1, nodes=[{"id": 2, "bookmarked": True}])
    assert changed_there.value.conflicts == [{"kind": "deleted", "node": 2, "field": None}]
    assert changed_there.value.changes["deleted"] == [2]
    with pytest.raises(StoryConflict) as grown:  # B, from rev 1, adds a child under node 2
        write(store, sid, base_revision=1, nodes=[node(4, STORY + " A. More.", 2)])
    assert grown.value.conflicts == [{"kind": "deleted", "node": 2, "field": None}]

    write(store, sid, base_revision=2, nodes=[{"id": 3, "bookmarked": True}])  # rev 3
    with pytest.raises(StoryConflict) as deleted_here:  # from rev 2, delete what was changed
        write(store, sid, base_revision=2, deleted=[3])
    assert deleted_here.value.conflicts == [{"kind": "changed", "node": 3, "field": None}]

    write(store, sid, base_revision=3, nodes=[node(5, STORY + " B. On.", 3)])  # rev 4: grows 3
    with pytest.raises(StoryConflict) as under:  # from rev 3, delete 3 (not knowing 5)
        write(store, sid, base_revision=3, deleted=[3])
    assert under.value.conflicts == [{"kind": "grown", "node": 3, "field": None}]
    # Knowing it, deleting both is fine; undoing that (resending the nodes whole) too.
    write(store, sid, base_revision=4, deleted=[3, 5])
    back = write(store, sid, base_revision=5, nodes=[node(3, STORY + " B.", 1), node(5, "x", 3)])
    assert back["renumbered"] == {} and set(nodes_of(store, sid)) == {1, 3, 5}


def test_memory_and_note_merge_per_field_and_name_and_current_never_conflict(
    store: StoryStore,
) -> None:
    sid = make(store, nodes=[node(1, STORY), node(2, STORY + " A.", 1)])["id"]
    write(store, sid, base_revision=1, context={"memory": "Maine."}, name="A", current=2)
    write(store, sid, base_revision=1, context={"note": "[gothic]"}, name="B", current=1)
    story = store.get(sid, ME)
    assert story["context"] == {"memory": "Maine.", "note": "[gothic]", "depth": 3}
    assert story["name"] == "B" and story["current"] == 1
    with pytest.raises(StoryConflict) as refused:
        write(store, sid, base_revision=1, context={"memory": "Oregon."})
    assert refused.value.conflicts == [{"kind": "changed", "node": None, "field": "memory"}]
    write(store, sid, base_revision=3, settings={"n": "4", "temperature": "0.8"})
    with pytest.raises(StoryConflict):
        write(store, sid, base_revision=3, settings={"n": "8"})


BAD_PATCHES: list[tuple[dict[str, Any], str]] = [
    ({"base_revision": 9}, "ahead of the story"),
    ({"base_revision": 1, "nodes": [node(7, "x", 6)]}, "parent 6 is not in the story"),
    ({"base_revision": 1, "nodes": [node(7, "x"), node(7, "y")]}, "sent twice"),
    ({"base_revision": 1, "nodes": [{"id": 7, "bookmarked": True}]}, "send its text"),
    ({"base_revision": 1, "nodes": [{"id": 1, "parent": 2}]}, "its own ancestor"),
    ({"base_revision": 1, "deleted": [1]}, "without its parent"),
    ({"base_revision": 1, "nodes": [node(3, "x", 1)], "deleted": [3]}, "both sent and deleted"),
]


@pytest.mark.parametrize(("patch", "reason"), BAD_PATCHES, ids=[r for _, r in BAD_PATCHES])
def test_a_bad_patch_is_refused_and_leaves_the_story_as_it_was(
    store: StoryStore, patch: dict[str, Any], reason: str
) -> None:
    sid = make(store, nodes=[node(1, STORY), node(2, STORY + " A.", 1)])["id"]
    before = store.get(sid, ME)
    with pytest.raises(BadStory, match=reason):
        store.patch(sid, StoryPatch.model_validate(patch), ME)
    after = store.get(sid, ME)
    assert after["nodes"] == before["nodes"] and after["revision"] == 1
    assert store.integrity() == "ok"


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"base_revision": 0}, "greater than or equal to 1"),
    ({"base_revision": 1, "nodes": [{"id": 0, "text": "x"}]}, "greater than or equal to 1"),
    ({"base_revision": 1, "nodes": [{"id": 1, "colour": "red"}]}, "Extra inputs"),
    ({"base_revision": 1, "name": "one\ntwo"}, "control characters"),
    ({"base_revision": 1, "name": "   "}, "cannot be empty"),
    ({"base_revision": 1, "name": "x" * 201}, "at most 200"),
    ({"base_revision": 1, "nodes": [{"id": 1, "choices": [card("x")] * 257}]}, "at most 256"),
    ({"base_revision": 1, "settings": {str(i): "x" for i in range(65)}}, "at most 64"),
]


@pytest.mark.parametrize(("body", "reason"), BAD_BODIES, ids=[r for _, r in BAD_BODIES])
def test_bad_shapes_and_sizes_are_refused_before_the_store(
    body: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ValidationError, match=reason):
        StoryPatch.model_validate_json(json.dumps(body))


def test_deep_json_and_path_tricks_are_refused() -> None:
    deep = "[" * 5_000 + "]" * 5_000
    body = f'{{"base_revision": 1, "nodes": [{{"id": 1, "params": {{"x": {deep}}}}}]}}'
    with pytest.raises(ValidationError, match="recursion"):
        StoryPatch.model_validate_json(body)
    with pytest.raises(ValidationError, match="pattern"):
        StoryDraft.model_validate({"id": "../../etc/passwd"})


def test_sizes_are_bounded(store: StoryStore) -> None:
    sid = make(store)["id"]
    huge = "x" * 800_000
    too_big = [card(huge), card(huge), card(huge), card(huge), card(huge), card(huge)]
    assert len(json.dumps(too_big)) > MAX_NODE_BYTES
    with pytest.raises(StoryTooLarge, match="node 1 takes"):
        write(store, sid, base_revision=1, nodes=[{"id": 1, "choices": too_big}])
    assert store.get(sid, ME)["revision"] == 1 and store.integrity() == "ok"


def test_the_trash_is_emptied_after_its_days(store: StoryStore) -> None:
    kept, gone = make(store)["id"], make(store)["id"]
    store.delete(gone, ME)
    store.purge_trash(now=time.time() + TRASH_DAYS * 86_400 - 60)
    assert store.restore(gone, ME)["id"] == gone
    store.delete(gone, ME)
    assert store.purge_trash(now=time.time() + TRASH_DAYS * 86_400 + 60) == 1
    with pytest.raises(StoryNotFound):
        store.restore(gone, ME)
    assert [s["id"] for s in store.list(ME)] == [kept]


# A writer that prints each revision once its write returned (confirmed), then is killed.
WRITER = """
import sys
from pathlib import Path
from llama_srb.stories.schema import StoryDraft, StoryPatch
from llama_srb.stories import merge as merge_module
from llama_srb.stories import rows as rows_module
from llama_srb.stories import store as store_module
from llama_srb.stories.owners import LOCAL, Access
from llama_srb.stories.store import StoryStore
store = StoryStore(Path(sys.argv[1]))
me = Access("writer")
story = store.create(StoryDraft.model_validate({"nodes": [{"id": 1, "text": "Once."}]}), me)
print(story["id"], flush=True)
revision = 1
for i in range(2, 100_000):
    text = "Once." + " More." * i + "x" * 4000
    patch = {"base_revision": revision, "nodes": [{"id": i, "parent": i - 1, "text": text}]}
    revision = store.patch(story["id"], StoryPatch.model_validate(patch), me)["revision"]
    print(revision, flush=True)
"""


def test_a_writer_killed_mid_write_loses_nothing_it_confirmed(tmp_path: Path) -> None:
    path = tmp_path / "stories.sqlite3"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    story_id = writer.stdout.readline().strip()
    confirmed = 0
    while confirmed < 40:
        confirmed = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)  # mid-write, most likely: it writes all the time
    writer.wait()
    confirmed = max([confirmed, *(int(line) for line in writer.stdout.read().split())])

    store = StoryStore(path)
    assert store.integrity() == "ok"
    story = store.get(story_id, ME)
    # Every confirmed write is there; one more may be, if it committed before its print.
    assert story["revision"] in (confirmed, confirmed + 1)
    ids = [n["id"] for n in story["nodes"]]
    assert ids == list(range(1, story["revision"] + 1))
    assert all(n["parent"] == n["id"] - 1 for n in story["nodes"][1:])


# -- owners, bounds, the trash, compaction (issue 38) -------------------------------------

ALICE, BOB, ROOT = Access("alice"), Access("bob"), Access("root", admin=True)


def test_a_writers_stories_are_theirs_alone_and_an_admin_sees_all(store: StoryStore) -> None:
    """Bob cannot list, read, change, delete, restore or copy Alice's story: to him it
    does not exist (the same 404 as an unknown id). An admin can do all of it."""
    sid = store.create(StoryDraft.model_validate({"nodes": [node(1, STORY)]}), ALICE)["id"]
    assert [s["id"] for s in store.list(ALICE)] == [sid] and store.list(BOB) == []
    bobs_tries = [
        lambda: store.get(sid, BOB),
        lambda: store.changes(sid, 0, BOB),
        lambda: store.patch(sid, StoryPatch(base_revision=1, name="Bob's now"), BOB),
        lambda: store.delete(sid, BOB),
        lambda: store.restore(sid, BOB),
        lambda: store.duplicate(sid, None, BOB),
        lambda: store.give(sid, "bob", BOB),
    ]
    for attempt in bobs_tries:
        with pytest.raises(StoryNotFound, match="no story with the id") as refused:
            attempt()
        assert str(refused.value) == f"no story with the id {sid!r}"
    assert store.get(sid, ALICE)["revision"] == 1  # nothing of Bob's landed

    assert [s["owner"] for s in store.list(ROOT)] == ["alice"]
    write_ = store.patch(sid, StoryPatch(base_revision=1, name="Checked"), ROOT)
    assert write_["revision"] == 2
    with pytest.raises(NotAllowed, match="only an admin"):
        store.give(sid, "bob", ALICE)
    assert store.give(sid, "bob", ROOT)["owner"] == "bob"
    assert store.list(ALICE) == [] and store.get(sid, BOB)["name"] == "Checked"
    store.delete(sid, ROOT)
    with pytest.raises(StoryNotFound):  # not a 410 for another writer either
        store.get(sid, ALICE)
    with pytest.raises(StoryDeleted):
        store.get(sid, BOB)


def test_stories_made_before_owners_are_the_local_writers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A library of schema 1 (issue 30) opens: its stories belong to the local writer
    (the owner without keys), who sees them as before; a named writer does not."""
    path = tmp_path / "stories.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_1)
    old.close()
    store = StoryStore(path)
    assert "its 1 stories, made before, belong to the local writer" in caplog.text
    local = Access(LOCAL, admin=True)
    story = store.get("old-story-1", local)
    assert story["owner"] is None and [n["id"] for n in story["nodes"]] == [1, 2]
    assert store.list(ALICE) == []
    with pytest.raises(StoryNotFound):
        store.get("old-story-1", ALICE)
    # The depths were worked out: the story keeps growing, within its bounds.
    grown = store.patch(
        "old-story-1",
        StoryPatch.model_validate({"base_revision": 2, "nodes": [node(3, "c", 2)]}),
        local,
    )
    assert grown["revision"] == 3 and store.integrity() == "ok"


SCHEMA_1 = """
CREATE TABLE stories (id TEXT PRIMARY KEY, name TEXT NOT NULL, revision INTEGER NOT NULL,
  next_id INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, opened REAL NOT NULL,
  deleted REAL, words INTEGER NOT NULL, nodes INTEGER NOT NULL, bytes INTEGER NOT NULL,
  meta TEXT NOT NULL, meta_revs TEXT NOT NULL);
CREATE TABLE nodes (story TEXT NOT NULL REFERENCES stories(id) ON DELETE CASCADE,
  id INTEGER NOT NULL, created_rev INTEGER NOT NULL, rev INTEGER NOT NULL, parent INTEGER,
  size INTEGER NOT NULL, body TEXT, revs TEXT NOT NULL, PRIMARY KEY (story, id)) WITHOUT ROWID;
CREATE INDEX nodes_by_rev ON nodes (story, rev);
INSERT INTO stories VALUES ('old-story-1', 'Old', 2, 3, 0, 0, 0, NULL, 1, 2, 40,
  '{"current":2,"memory":"","note":"","depth":3,"settings":{}}',
  '{"name":1,"current":1,"memory":1,"note":1,"depth":1,"settings":1}');
INSERT INTO nodes VALUES ('old-story-1', 1, 1, 1, NULL, 20, '{"parent":null,"text":"a"}', '{}');
INSERT INTO nodes VALUES ('old-story-1', 2, 2, 2, 1, 20, '{"parent":1,"text":"b"}', '{}');
PRAGMA user_version = 1;
"""


def test_deleted_stories_leave_room_and_the_trash_keeps_the_newest(
    store: StoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's lockout: a full library emptied into the trash takes new stories at
    once; the trash keeps its newest MAX_TRASH; emptying it forgets them for good."""
    monkeypatch.setattr(store_module, "MAX_STORIES", 3)
    monkeypatch.setattr(store_module, "MAX_TRASH", 2)
    made = [make(store)["id"] for _ in range(3)]
    with pytest.raises(LibraryFull, match="its limit"):
        make(store)
    assert store.create(StoryDraft(), BOB)  # one writer's full library is not another's
    for sid in made:
        store.delete(sid, ME)
    assert make(store)["id"]  # room again: the trash does not count
    with pytest.raises(StoryNotFound):
        store.restore(made[0], ME)  # the oldest was purged to keep the trash at 2
    assert store.restore(made[1], ME)["id"] == made[1]
    store.delete(made[1], ME)
    assert store.empty_trash(BOB) == 0  # Bob's trash is his own
    assert store.empty_trash(ME) == 2
    for sid in made:
        with pytest.raises(StoryNotFound):
            store.restore(sid, ME)


def chain(length: int, start: int = 1, parent: int | None = None) -> list[dict[str, Any]]:
    ids = range(start, start + length)
    return [node(i, "x", parent if i == start else i - 1) for i in ids]


def test_depth_and_node_count_are_bounded_with_a_message_naming_the_limit(
    store: StoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (merge_module, rows_module, store_module):
        monkeypatch.setattr(module, "MAX_DEPTH", 50)
    monkeypatch.setattr(rows_module, "MAX_NODES", 60)
    with pytest.raises(BadStory, match="at most 50 deep"):
        make(store, nodes=chain(52))
    sid = make(store, nodes=chain(51))["id"]  # depths 0 to 50
    with pytest.raises(BadStory, match="at most 50 deep"):
        write(store, sid, base_revision=1, nodes=[node(52, "x", 51)])
    write(store, sid, base_revision=1, nodes=[node(52, "x", 1), node(53, "y", 52)])
    with pytest.raises(BadStory, match="at most 50 deep"):
        write(store, sid, base_revision=2, nodes=[{"id": 52, "parent": 51}])
    with pytest.raises(BadStory, match="at most 50 deep"):  # 52 fits there, 53 under it not
        write(store, sid, base_revision=2, nodes=[{"id": 52, "parent": 50}])
    moved = write(store, sid, base_revision=2, nodes=[{"id": 52, "parent": 48}])
    assert moved["revision"] == 3
    with pytest.raises(BadStory, match="its own ancestor"):
        write(store, sid, base_revision=3, nodes=[{"id": 2, "parent": 40}])
    with pytest.raises(BadStory, match="may have 60"):
        write(store, sid, base_revision=3, nodes=chain(8, start=54, parent=1))
    assert store.get(sid, ME)["revision"] == 3 and store.integrity() == "ok"


def test_tombstones_are_compacted_and_an_older_copy_gets_the_whole_story(
    store: StoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_TOMBSTONES", 10)
    sid = make(store, nodes=[node(1, STORY)])["id"]
    write(store, sid, base_revision=1, nodes=[node(2, "kept", 1)])  # rev 2
    revision = 2
    for i in range(3, 30):  # each made, then deleted: a tombstone each
        revision = write(store, sid, base_revision=revision, nodes=[node(i, "x", 1)])["revision"]
        revision = write(store, sid, base_revision=revision, deleted=[i])["revision"]
    with sqlite3.connect(store.path) as db:
        left = db.execute("SELECT COUNT(*) FROM nodes WHERE body IS NULL").fetchone()[0]
    assert left <= 10
    recent = store.changes(sid, revision - 1, ME)
    assert "whole" not in recent and recent["deleted"] == [29]
    old = store.changes(sid, 2, ME)  # a copy from before the forgotten deletions
    assert old["whole"] is True and [n["id"] for n in old["nodes"]] == [1, 2]
    # A write from that copy to a node deleted (and forgotten) since is a conflict.
    with pytest.raises(StoryConflict) as refused:
        write(store, sid, base_revision=4, nodes=[{"id": 3, "bookmarked": True}])
    assert refused.value.conflicts == [{"kind": "deleted", "node": 3, "field": None}]
    assert refused.value.changes["whole"] is True


def sqlite_work(store: StoryStore, job: Any) -> tuple[int, int]:
    """SQLite's virtual-machine steps (in tens) that `job` runs under the store's lock
    (its write connection) and outside it (this thread's read connection): the work,
    counted, not timed."""
    steps = {"locked": 0, "free": 0}
    store.list(ME)  # this thread's read connection, opened
    connections = {"locked": store._db, "free": store._local.db}
    for kind, db in connections.items():

        def count(kind: str = kind) -> int:
            steps[kind] += 1
            return 0

        db.set_progress_handler(count, 10)
    try:
        job()
    finally:
        for db in connections.values():
            db.set_progress_handler(None, 10)
    return steps["locked"], steps["free"]


def test_a_write_costs_what_it_changes_not_the_story(store: StoryStore) -> None:
    """The issue's stall: a one-node write to a story of 9,999 nodes does about the work
    of one to a story of one node, under the lock and outside it; the big story's write
    of every node works outside the lock, and under it only writes its rows."""
    small = make(store, nodes=[node(1, STORY)])["id"]
    tree = [node(1, STORY)] + [node(i, f"n{i}", (i - 1) if i % 2 else 1) for i in range(2, 10_000)]
    big = make(store, nodes=tree)["id"]
    one = {"base_revision": 1, "nodes": [node(10_001, "new", 3)]}
    small_work = sqlite_work(
        store, lambda: write(store, small, **{**one, "nodes": [node(2, "new", 1)]})
    )
    big_work = sqlite_work(store, lambda: write(store, big, **one))
    for kind in (0, 1):  # locked, free
        assert big_work[kind] <= 2 * small_work[kind], (small_work, big_work)
    every = {"base_revision": 2, "nodes": [{"id": i, "bookmarked": True} for i in range(1, 10_000)]}
    whole = sqlite_work(store, lambda: write(store, big, **every))
    assert whole[0] > 50 * big_work[0]  # the counter sees work when there is work

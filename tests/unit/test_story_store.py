"""The story library's store on a real SQLite file (no model): revisions, merged writes
from two writers, conflicts, bounds, bad input that leaves the store as it was, the trash,
and a writer process killed with SIGKILL mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from llama_srb.stories.schema import MAX_NODE_BYTES, TRASH_DAYS, StoryDraft, StoryPatch
from llama_srb.stories.store import (
    BadStory,
    StoryConflict,
    StoryDeleted,
    StoryExists,
    StoryNotFound,
    StoryStore,
    StoryTooLarge,
)

STORY = "The lighthouse keeper found a letter on the rocks."


@pytest.fixture
def store(tmp_path: Path) -> StoryStore:
    return StoryStore(tmp_path / "stories.sqlite3")


def node(node_id: int, text: str, parent: int | None = None, **more: Any) -> dict[str, Any]:
    return {"id": node_id, "parent": parent, "text": text, **more}


def card(text: str) -> dict[str, Any]:
    return {"text": text, "finish_reason": "stop", "tokens": 3, "edited": False}


def make(store: StoryStore, **draft: Any) -> dict[str, Any]:
    draft.setdefault("nodes", [node(1, STORY, choices=[card(" It said: come."), card(" Run.")])])
    return store.create(StoryDraft.model_validate(draft))


def write(store: StoryStore, story_id: str, **patch: Any) -> dict[str, Any]:
    return store.patch(story_id, StoryPatch.model_validate(patch))


def nodes_of(store: StoryStore, story_id: str) -> dict[int, dict[str, Any]]:
    return {n["id"]: n for n in store.get(story_id)["nodes"]}


def test_a_story_is_made_listed_renamed_duplicated_deleted_and_restored(
    store: StoryStore,
) -> None:
    story = make(store, name="Lighthouse", context={"memory": "Maine, 1890.", "note": "[gothic]"})
    assert story["revision"] == 1 and story["words"] == len(STORY.split())
    assert story["context"] == {"memory": "Maine, 1890.", "note": "[gothic]", "depth": 3}
    assert [s["name"] for s in store.list()] == ["Lighthouse"]

    renamed = write(store, story["id"], base_revision=1, name="  The Letter ")
    assert renamed["revision"] == 2 and renamed["changes"]["fields"] == {"name": "The Letter"}
    copy = store.duplicate(story["id"], None)
    assert copy["name"] == "The Letter (copy)" and copy["revision"] == 1
    assert nodes_of(store, copy["id"]) == nodes_of(store, story["id"])
    assert store.get(copy["id"])["context"]["memory"] == "Maine, 1890."
    assert [s["name"] for s in store.list()] == [
        "The Letter (copy)",
        "The Letter",
    ]  # opened last first

    store.delete(story["id"])
    assert [s["id"] for s in store.list()] == [copy["id"]]
    with pytest.raises(StoryDeleted):
        store.get(story["id"])
    assert store.restore(story["id"])["name"] == "The Letter"
    assert nodes_of(store, story["id"])[1]["text"] == STORY

    with pytest.raises(StoryNotFound):
        store.get("no-such-story")
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
    assert store.changes(sid, 1)["nodes"] == caught_up["changes"]["nodes"]


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
    assert store.get(sid)["current"] == 3 and store.get(sid)["next_id"] == 5
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
    story = store.get(sid)
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
    before = store.get(sid)
    with pytest.raises(BadStory, match=reason):
        store.patch(sid, StoryPatch.model_validate(patch))
    after = store.get(sid)
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
    assert store.get(sid)["revision"] == 1 and store.integrity() == "ok"


def test_the_trash_is_emptied_after_its_days(store: StoryStore) -> None:
    kept, gone = make(store)["id"], make(store)["id"]
    store.delete(gone)
    store.purge_trash(now=time.time() + TRASH_DAYS * 86_400 - 60)
    assert store.restore(gone)["id"] == gone
    store.delete(gone)
    assert store.purge_trash(now=time.time() + TRASH_DAYS * 86_400 + 60) == 1
    with pytest.raises(StoryNotFound):
        store.restore(gone)
    assert [s["id"] for s in store.list()] == [kept]


# A writer that prints each revision once its write returned (confirmed), then is killed.
WRITER = """
import sys
from pathlib import Path
from llama_srb.stories.schema import StoryDraft, StoryPatch
from llama_srb.stories.store import StoryStore
store = StoryStore(Path(sys.argv[1]))
story = store.create(StoryDraft.model_validate({"nodes": [{"id": 1, "text": "Once."}]}))
print(story["id"], flush=True)
revision = 1
for i in range(2, 100_000):
    text = "Once." + " More." * i + "x" * 4000
    patch = {"base_revision": revision, "nodes": [{"id": i, "parent": i - 1, "text": text}]}
    revision = store.patch(story["id"], StoryPatch.model_validate(patch))["revision"]
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
    story = store.get(story_id)
    # Every confirmed write is there; one more may be, if it committed before its print.
    assert story["revision"] in (confirmed, confirmed + 1)
    ids = [n["id"] for n in story["nodes"]]
    assert ids == list(range(1, story["revision"] + 1))
    assert all(n["parent"] == n["id"] - 1 for n in story["nodes"][1:])

"""The story library's SQLite rows: the tables, and what a write puts in them, built and
checked against the bounds before the store takes its lock (store.py): a new story's
nodes (`NewNodes`), a planned patch (`Staged`), and what a patch's plan reads of the
stored nodes (`KnownRows`: only the nodes it names, never the whole story).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

from llama_srb.stories.errors import BadStory, StoryTooLarge
from llama_srb.stories.merge import Body, Plan, Slot, live_after
from llama_srb.stories.schema import (
    MAX_DEPTH,
    MAX_NODE_BYTES,
    MAX_NODES,
    MAX_STORY_BYTES,
    NODE_FIELDS,
    StoryDraft,
    StoryPatch,
)

SCHEMA_VERSION = 2
TABLES = [
    """CREATE TABLE stories (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL DEFAULT '', -- the writer it belongs to ('': the local writer)
    name TEXT NOT NULL,
    revision INTEGER NOT NULL,
    next_id INTEGER NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    opened REAL NOT NULL,
    deleted REAL,               -- when it went to the trash; NULL while it is in the library
    words INTEGER NOT NULL,
    nodes INTEGER NOT NULL,     -- live ones
    bytes INTEGER NOT NULL,     -- JSON of the live nodes
    meta TEXT NOT NULL,         -- {current, memory, note, depth, settings, model}
    meta_revs TEXT NOT NULL,    -- per key of meta (and name), the revision that set it
    tombstones INTEGER NOT NULL DEFAULT 0,
    floor INTEGER NOT NULL DEFAULT 0 -- tombstones deleted at or before it are compacted away
)""",
    """CREATE TABLE nodes (
    story TEXT NOT NULL REFERENCES stories(id) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    created_rev INTEGER NOT NULL,
    rev INTEGER NOT NULL,
    parent INTEGER,
    size INTEGER NOT NULL,
    body TEXT,                  -- NULL: deleted (a tombstone)
    revs TEXT NOT NULL,
    depth INTEGER NOT NULL DEFAULT 0, -- ancestors (live nodes)
    PRIMARY KEY (story, id)
) WITHOUT ROWID""",
]
FROM_V1 = [  # schema 1 (issue 30): no owners, no depths, no compaction
    "ALTER TABLE stories ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE stories ADD COLUMN tombstones INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE stories ADD COLUMN floor INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE nodes ADD COLUMN depth INTEGER NOT NULL DEFAULT 0",
    "UPDATE stories SET tombstones ="
    " (SELECT COUNT(*) FROM nodes WHERE story = stories.id AND body IS NULL)",
]
INDEXES = [
    "CREATE INDEX IF NOT EXISTS nodes_by_rev ON nodes (story, rev)",
    "CREATE INDEX IF NOT EXISTS nodes_children ON nodes (story, parent) WHERE body IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS nodes_newest ON nodes (story, created_rev, id)"
    " WHERE body IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS nodes_tombstones ON nodes (story, rev) WHERE body IS NULL",
    "CREATE INDEX IF NOT EXISTS stories_by_owner ON stories (owner, deleted)",
]
NODE_COLUMNS = "story, id, created_rev, rev, parent, size, body, revs, depth"
# An upsert changes a stored row in place: only the indexes of what changed are touched.
PUT_NODE = (
    f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (story, id) DO UPDATE SET created_rev = excluded.created_rev,"
    " rev = excluded.rev, parent = excluded.parent, size = excluded.size,"
    " body = excluded.body, revs = excluded.revs, depth = excluded.depth"
)
SLOT_COLUMNS = "id, created_rev, rev, parent, size, body IS NOT NULL AS live, revs, depth"


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _words(text: str) -> int:
    return len(text.split())


FIRST_REVS = to_json(dict.fromkeys(NODE_FIELDS, 1))


class Staged:
    """A plan's rows and the story's new counts and fields, built (and checked against
    the bounds) before the lock is taken."""

    def __init__(self, row: sqlite3.Row, known: KnownRows, plan: Plan) -> None:
        story_id, new = row["id"], row["revision"] + 1
        self.rows: list[tuple[Any, ...]] = []
        count, size, tombstones = row["nodes"], row["bytes"], row["tombstones"]
        for write in plan.writes.values():
            slot = known.slot(write.id)
            if slot is not None and slot.live:
                count, size = count - 1, size - slot.size
            elif slot is not None and slot.created_rev:  # a stored tombstone comes back
                tombstones -= 1
            if write.body is None:
                tombstones += 1
                self.rows.append(
                    (story_id, write.id, write.created_rev, new, None, 0, None, "{}", 0)
                )
                continue
            body = to_json(write.body)
            node_size = _checked_size(write.id, body)
            count, size = count + 1, size + node_size
            parent = write.body.get("parent")
            self.rows.append(
                (
                    story_id,
                    write.id,
                    write.created_rev,
                    new,
                    parent,
                    node_size,
                    body,
                    to_json(write.revs),
                    write.depth,
                )
            )
        if count > MAX_NODES:
            raise BadStory(f"the story would have {count} nodes; a story may have {MAX_NODES}")
        if size > MAX_STORY_BYTES:
            raise StoryTooLarge(
                f"the story would take {size} bytes; a story may take {MAX_STORY_BYTES}"
            )
        self.count, self.size, self.tombstones = count, size, tombstones
        self.meta = json.loads(row["meta"])
        self.meta_revs = json.loads(row["meta_revs"])
        changed = dict(plan.meta)
        self.name = changed.pop("name", row["name"])
        if self.name != row["name"]:
            self.meta_revs["name"] = new
        for key, value in changed.items():
            self.meta[key] = value
            self.meta_revs[key] = new
        current = self.meta.get("current")
        if current is not None and not live_after(known, plan, current):
            self.meta["current"] = current = None
        self.recount_words = "current" in changed or current in plan.writes or current is None


class NewNodes:
    """A new story's nodes, checked (each once, every parent among them, no cycle, within
    the bounds) and serialized: the rows to insert, built before the store's lock."""

    def __init__(self, draft: StoryDraft, story_id: str) -> None:
        bodies: dict[int, Body] = {}
        for node in draft.nodes:
            if node.id in bodies:
                raise BadStory(f"node {node.id} is sent twice")
            bodies[node.id] = node.body()
        self.bodies = bodies
        depths = self._depths()
        self.rows: list[tuple[Any, ...]] = []
        self.size = 0
        for node_id, body in bodies.items():
            text = to_json(body)
            size = _checked_size(node_id, text)
            self.size += size
            self.rows.append(
                (story_id, node_id, 1, 1, body["parent"], size, text, FIRST_REVS, depths[node_id])
            )
        if self.size > MAX_STORY_BYTES:
            raise StoryTooLarge(
                f"the story's nodes take {self.size} bytes; a story may take {MAX_STORY_BYTES}"
            )

    def _depths(self) -> dict[int, int]:
        """Each node's depth, each ancestry walked once."""
        depth: dict[int, int] = {}
        for start in self.bodies:
            path: list[int] = []
            on_path: set[int] = set()
            at: int | None = start
            while at is not None and at not in depth:
                if at not in self.bodies:
                    raise BadStory(f"node {path[-1]}'s parent {at} is not in the story")
                if at in on_path:
                    raise BadStory(f"node {at} is its own ancestor")
                path.append(at)
                on_path.add(at)
                at = self.bodies[at]["parent"]
            below = -1 if at is None else depth[at]
            for node_id in reversed(path):
                below += 1
                depth[node_id] = below
            if depth[start] > MAX_DEPTH:
                raise BadStory(
                    f"node {start} is {depth[start]} nodes below the story's first:"
                    f" a story may be at most {MAX_DEPTH} deep"
                )
        return depth

    def words(self, current: int | None) -> int:
        """The words of the current node, else of the newest."""
        if current is None:
            current = max(self.bodies, default=None)
        return _words(self.bodies[current]["text"]) if current is not None else 0


class KnownRows:
    """What a patch needs of its story's nodes (merge.Known), read from the database as
    the plan asks: the slots of the nodes it names, fetched in one query, and what else
    the plan looks at. Ids deleted before the compaction floor are gone: for a writer
    whose base is older, any id below next_id that is not stored was deleted then."""

    def __init__(self, db: sqlite3.Connection, row: sqlite3.Row, patch: StoryPatch) -> None:
        self._db, self._story = db, row["id"]
        self._gone_at = row["floor"] if patch.base_revision < row["floor"] else 0
        self._next_id = row["next_id"]
        self._slots: dict[int, Slot | None] = {}
        self._bodies: dict[int, str] = {}
        sent = [n.id for n in patch.nodes]
        parents = [n.parent for n in patch.nodes if n.parent is not None]
        self._fetch([*sent, *patch.deleted, *parents])
        for r in db.execute(
            "SELECT id, body FROM nodes WHERE story = ? AND body IS NOT NULL"
            " AND id IN (SELECT value FROM json_each(?))",
            (self._story, json.dumps(sent)),
        ):
            self._bodies[r["id"]] = r["body"]

    def _fetch(self, ids: list[int]) -> None:
        for r in self._db.execute(
            f"SELECT {SLOT_COLUMNS} FROM nodes WHERE story = ?"
            " AND id IN (SELECT value FROM json_each(?))",
            (self._story, json.dumps(ids)),
        ):
            self._slots[r["id"]] = _slot(r)
        for node_id in ids:
            if node_id not in self._slots:
                self._slots[node_id] = self._gone(node_id)

    def _gone(self, node_id: int) -> Slot | None:
        if self._gone_at and node_id < self._next_id:
            return Slot(node_id, 0, self._gone_at, None, False, 0, {})
        return None

    def slot(self, node_id: int) -> Slot | None:
        if node_id not in self._slots:
            self._fetch([node_id])
        return self._slots[node_id]

    def body(self, node_id: int) -> Body:
        if node_id not in self._bodies:
            row = self._db.execute(
                "SELECT body FROM nodes WHERE story = ? AND id = ?", (self._story, node_id)
            ).fetchone()
            self._bodies[node_id] = row["body"]
        body: Body = json.loads(self._bodies[node_id])
        return body

    def children(self, node_id: int) -> list[Slot]:
        rows = self._db.execute(
            f"SELECT {SLOT_COLUMNS} FROM nodes INDEXED BY nodes_children"
            " WHERE story = ? AND parent = ?"
            " AND body IS NOT NULL",
            (self._story, node_id),
        )
        return [_slot(r) for r in rows]


def _slot(r: sqlite3.Row) -> Slot:
    return Slot(
        r["id"],
        r["created_rev"],
        r["rev"],
        r["parent"],
        bool(r["live"]),
        r["size"],
        json.loads(r["revs"]),
        r["depth"],
    )


def _checked_size(node_id: int, text: str) -> int:
    size = len(text.encode())
    if size > MAX_NODE_BYTES:
        raise StoryTooLarge(f"node {node_id} takes {size} bytes; a node may take {MAX_NODE_BYTES}")
    return size


def words_now(db: sqlite3.Connection, story_id: str, current: int | None) -> int:
    """The words of the story as the writer last left it: the current node, else the
    newest (an index finds either: no scan of the story)."""
    text = None
    if current is not None:
        text = db.execute(
            "SELECT json_extract(body, '$.text') FROM nodes WHERE story = ? AND id = ?"
            " AND body IS NOT NULL",
            (story_id, current),
        ).fetchone()
    if text is None:
        text = db.execute(
            "SELECT json_extract(body, '$.text') FROM nodes INDEXED BY nodes_newest"
            " WHERE story = ? AND body IS NOT NULL"
            " ORDER BY created_rev DESC, id DESC LIMIT 1",
            (story_id,),
        ).fetchone()
    return _words(text[0]) if text and text[0] else 0


def compact(
    db: sqlite3.Connection, story_id: str, floor: int, tombstones: int, keep: int
) -> tuple[int, int]:
    """Forget a story's tombstones but the newest `keep`; the floor rises to the newest
    revision forgotten (a writer whose base is older gets the whole story to catch up)."""
    cut = db.execute(
        "SELECT rev FROM nodes INDEXED BY nodes_tombstones WHERE story = ? AND body IS NULL"
        " ORDER BY rev DESC LIMIT 1 OFFSET ?",
        (story_id, keep),
    ).fetchone()
    if cut is None:
        return floor, tombstones
    gone = db.execute(
        "DELETE FROM nodes INDEXED BY nodes_tombstones WHERE story = ? AND body IS NULL"
        " AND rev <= ?",
        (story_id, cut["rev"]),
    ).rowcount
    return max(floor, cut["rev"]), tombstones - gone


def name_from(bodies: dict[int, Body]) -> str:
    """A new story's name when none is given: the first words of its first text."""
    first = next((b["text"] for b in bodies.values() if b.get("parent") is None), "")
    words = first.split()
    if not words:
        return "Untitled story"
    name = " ".join(words[:6])
    return name if len(words) <= 6 else f"{name}…"

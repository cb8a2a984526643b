"""The story library: one SQLite file (WAL, a transaction per write, synced to disk before
a write is confirmed), so a killed server or machine loses nothing it said it had saved.

Each story has a revision, raised by every write that changes it; each node remembers the
revision that made it and the one that last changed each of its fields, which is what
lets writes from two tabs or devices merge (merge.py) instead of overwriting each other.
Deleted nodes stay as tombstones (id and revisions, no body) for that reason; deleted
stories stay in the trash for TRASH_DAYS days.

Blocking: call it from a worker thread. One lock serialises its operations.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llama_srb.stories.merge import BadPatch, Body, Plan, Slot, Write, plan_patch
from llama_srb.stories.schema import (
    MAX_NODE_BYTES,
    MAX_NODES,
    MAX_STORIES,
    MAX_STORY_BYTES,
    TRASH_DAYS,
    Context,
    StoryDraft,
    StoryPatch,
)

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS stories (
    id TEXT PRIMARY KEY,
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
    meta TEXT NOT NULL,         -- {current, memory, note, depth, settings}
    meta_revs TEXT NOT NULL     -- per key of meta (and name), the revision that set it
);
CREATE TABLE IF NOT EXISTS nodes (
    story TEXT NOT NULL REFERENCES stories(id) ON DELETE CASCADE,
    id INTEGER NOT NULL,
    created_rev INTEGER NOT NULL,
    rev INTEGER NOT NULL,
    parent INTEGER,
    size INTEGER NOT NULL,
    body TEXT,                  -- NULL: deleted (a tombstone)
    revs TEXT NOT NULL,
    PRIMARY KEY (story, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nodes_by_rev ON nodes (story, rev);
"""


class StoryError(Exception):
    """A refusal the client can act on; `code` names it (the routes map it to a status)."""

    code = "story_error"


class StoryNotFound(StoryError):
    code = "story_not_found"


class StoryDeleted(StoryError):
    code = "story_deleted"


class StoryExists(StoryError):
    code = "story_exists"


class LibraryFull(StoryError):
    code = "library_full"


class StoryTooLarge(StoryError):
    code = "story_too_large"


class BadStory(StoryError):
    code = "invalid_story"


class StoryConflict(StoryError):
    """Others changed what this write changes: nothing was written. `changes`: everything
    since the writer's base revision, to merge and ask about."""

    code = "story_conflict"

    def __init__(self, message: str, conflicts: list[dict[str, Any]], changes: dict[str, Any]):
        super().__init__(message)
        self.conflicts = conflicts
        self.changes = changes


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _words(text: str) -> int:
    return len(text.split())


def new_story_id() -> str:
    return secrets.token_urlsafe(12)


class StoryStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        # Autocommit mode: every write below is one explicit BEGIN IMMEDIATE … COMMIT.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit is on disk before the write is confirmed (NORMAL could lose the
        # last ones on a power cut; a killed process loses nothing either way).
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA busy_timeout = 5000")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{path} was written by a newer llama-srb (schema {version}); upgrade to open it"
            )
        self._db.executescript(f"BEGIN;{_SCHEMA}PRAGMA user_version = {SCHEMA_VERSION};COMMIT;")
        self.purge_trash()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction, all or nothing, under the store's lock."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- the library -----------------------------------------------------------------------

    def list(self) -> list[dict[str, Any]]:
        """The stories in the library (not the trash), the last opened first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM stories WHERE deleted IS NULL ORDER BY opened DESC, updated DESC"
            ).fetchall()
        return [self._summary(row) for row in rows]

    def create(self, draft: StoryDraft) -> dict[str, Any]:
        story_id = draft.id or new_story_id()
        bodies = self._checked_nodes(draft)
        now = time.time()
        current = draft.current if draft.current in bodies else None
        name = draft.name or _name_from(bodies)
        meta = {"current": current, **draft.context.model_dump(), "settings": draft.settings}
        with self._write() as db:
            if db.execute("SELECT 1 FROM stories WHERE id = ?", (story_id,)).fetchone():
                raise StoryExists(f"a story with the id {story_id!r} exists already")
            count = db.execute("SELECT COUNT(*) FROM stories").fetchone()[0]
            if count >= MAX_STORIES:
                raise LibraryFull(
                    f"the library holds {count} stories, its limit ({MAX_STORIES}), the trash"
                    f" included (deleted stories stay {TRASH_DAYS} days): delete some"
                )
            self._insert_story(db, story_id, name, meta, bodies, now)
            return self._full(db, story_id)

    def get(self, story_id: str) -> dict[str, Any]:
        """The whole story; it counts as opened now."""
        with self._write() as db:
            self._live_row(db, story_id)
            db.execute("UPDATE stories SET opened = ? WHERE id = ?", (time.time(), story_id))
            return self._full(db, story_id)

    def changes(self, story_id: str, since: int) -> dict[str, Any]:
        """What changed after revision `since`: for a writer to catch up."""
        with self._lock:
            row = self._live_row(self._db, story_id)
            if not 0 <= since <= row["revision"]:
                raise BadStory(
                    f"since must be between 0 and the story's revision {row['revision']}"
                )
            return self._changes(self._db, row, since)

    def patch(self, story_id: str, patch: StoryPatch) -> dict[str, Any]:
        """Applies a conditional write (merge.py), or raises StoryConflict with nothing
        written. Returns the new revision, the ids renumbered, and the changes since
        the patch's base (its own included)."""
        with self._write() as db:
            row = self._live_row(db, story_id)
            slots = self._slots(db, story_id)
            meta = {**json.loads(row["meta"]), "name": row["name"]}
            try:
                plan = plan_patch(
                    patch,
                    slots,
                    lambda node_id: self._body(db, story_id, node_id),
                    meta,
                    json.loads(row["meta_revs"]),
                    row["revision"],
                    row["next_id"],
                )
            except BadPatch as exc:
                raise BadStory(str(exc)) from None
            if plan.conflicts:
                n = len(plan.conflicts)
                raise StoryConflict(
                    f"{n} change(s) of this write clash with changes made elsewhere since"
                    f" revision {patch.base_revision}; nothing was saved",
                    [c.as_json() for c in plan.conflicts],
                    self._changes(db, row, patch.base_revision),
                )
            if not plan.empty:
                row = self._apply(db, row, slots, plan)
            result = self._changes(db, row, patch.base_revision)
            return {"revision": row["revision"], "renumbered": plan.renumbered, "changes": result}

    def delete(self, story_id: str) -> None:
        """To the trash: `restore` brings it back for TRASH_DAYS days."""
        with self._write() as db:
            row = self._row(db, story_id)
            if row["deleted"] is None:
                db.execute("UPDATE stories SET deleted = ? WHERE id = ?", (time.time(), story_id))

    def restore(self, story_id: str) -> dict[str, Any]:
        with self._write() as db:
            self._row(db, story_id)
            db.execute("UPDATE stories SET deleted = NULL WHERE id = ?", (story_id,))
            return self._summary(self._row(db, story_id))

    def duplicate(self, story_id: str, name: str | None) -> dict[str, Any]:
        """A new story with the same nodes, memory, note and settings (revision 1)."""
        with self._write() as db:
            row = self._live_row(db, story_id)
            count = db.execute("SELECT COUNT(*) FROM stories").fetchone()[0]
            if count >= MAX_STORIES:
                raise LibraryFull(f"the library holds its limit of {MAX_STORIES} stories")
            bodies = {
                r["id"]: json.loads(r["body"])
                for r in db.execute(
                    "SELECT id, body FROM nodes WHERE story = ? AND body IS NOT NULL", (story_id,)
                )
            }
            copy_id = new_story_id()
            meta = json.loads(row["meta"])
            self._insert_story(
                db, copy_id, name or f"{row['name']} (copy)", meta, bodies, time.time()
            )
            return self._summary(self._row(db, copy_id))

    def purge_trash(self, now: float | None = None) -> int:
        """Forget the stories deleted more than TRASH_DAYS days ago."""
        cutoff = (now or time.time()) - TRASH_DAYS * 86_400
        with self._write() as db:
            return db.execute(
                "DELETE FROM stories WHERE deleted IS NOT NULL AND deleted < ?", (cutoff,)
            ).rowcount

    def integrity(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])

    # -- rows ------------------------------------------------------------------------------

    def _row(self, db: sqlite3.Connection, story_id: str) -> sqlite3.Row:
        row = db.execute("SELECT * FROM stories WHERE id = ?", (story_id,)).fetchone()
        if row is None:
            raise StoryNotFound(f"no story with the id {story_id!r}")
        return row

    def _live_row(self, db: sqlite3.Connection, story_id: str) -> sqlite3.Row:
        row = self._row(db, story_id)
        if row["deleted"] is not None:
            raise StoryDeleted(
                f"the story {row['name']!r} is in the trash: restore it"
                f" (POST /v1/stories/{story_id}/restore) to open or change it"
            )
        return row

    def _slots(self, db: sqlite3.Connection, story_id: str) -> dict[int, Slot]:
        rows = db.execute(
            "SELECT id, created_rev, rev, parent, size, body IS NOT NULL AS live, revs"
            " FROM nodes WHERE story = ?",
            (story_id,),
        )
        return {
            r["id"]: Slot(
                r["id"],
                r["created_rev"],
                r["rev"],
                r["parent"],
                bool(r["live"]),
                r["size"],
                json.loads(r["revs"]),
            )
            for r in rows
        }

    def _body(self, db: sqlite3.Connection, story_id: str, node_id: int) -> Body:
        row = db.execute(
            "SELECT body FROM nodes WHERE story = ? AND id = ?", (story_id, node_id)
        ).fetchone()
        return json.loads(row["body"])

    def _checked_nodes(self, draft: StoryDraft) -> dict[int, Body]:
        """A new story's nodes: each once, every parent among them, no cycle, within bounds."""
        bodies: dict[int, Body] = {}
        for node in draft.nodes:
            if node.id in bodies:
                raise BadStory(f"node {node.id} is sent twice")
            bodies[node.id] = node.body()
        for node_id, body in bodies.items():
            steps, at = 0, body["parent"]
            while at is not None:
                if at not in bodies:
                    raise BadStory(f"node {node_id}'s parent {at} is not in the story")
                if at == node_id or steps > len(bodies):
                    raise BadStory(f"node {node_id} is its own ancestor")
                at, steps = bodies[at]["parent"], steps + 1
        sizes = [self._size(node_id, body) for node_id, body in bodies.items()]
        if sum(sizes) > MAX_STORY_BYTES:
            raise StoryTooLarge(
                f"the story's nodes take {sum(sizes)} bytes; a story may take {MAX_STORY_BYTES}"
            )
        return bodies

    @staticmethod
    def _size(node_id: int, body: Body) -> int:
        size = len(_json(body).encode())
        if size > MAX_NODE_BYTES:
            raise StoryTooLarge(
                f"node {node_id} takes {size} bytes; a node may take {MAX_NODE_BYTES}"
            )
        return size

    def _insert_story(
        self,
        db: sqlite3.Connection,
        story_id: str,
        name: str,
        meta: dict[str, Any],
        bodies: dict[int, Body],
        now: float,
    ) -> None:
        revs = dict.fromkeys(["name", *meta], 1)
        db.execute(
            "INSERT INTO stories VALUES (?, ?, 1, ?, ?, ?, ?, NULL, 0, 0, 0, ?, ?)",
            (story_id, name, max(bodies, default=0) + 1, now, now, now, _json(meta), _json(revs)),
        )
        for node_id, body in bodies.items():
            self._put_node(db, story_id, Write(node_id, body, dict.fromkeys(body, 1), 1), 1)
        self._refresh_stats(db, story_id, meta.get("current"))

    def _put_node(self, db: sqlite3.Connection, story_id: str, write: Write, rev: int) -> int:
        body = write.body
        size = 0 if body is None else self._size(write.id, body)
        db.execute(
            "INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                story_id,
                write.id,
                write.created_rev,
                rev,
                None if body is None else body.get("parent"),
                size,
                None if body is None else _json(body),
                _json(write.revs),
            ),
        )
        return size

    def _apply(
        self, db: sqlite3.Connection, row: sqlite3.Row, slots: dict[int, Slot], plan: Plan
    ) -> sqlite3.Row:
        story_id, new = row["id"], row["revision"] + 1
        live = {s.id for s in slots.values() if s.live}
        for write in plan.writes.values():
            self._put_node(db, story_id, write, new)
            (live.discard if write.body is None else live.add)(write.id)
        if len(live) > MAX_NODES:
            raise StoryTooLarge(f"the story would have {len(live)} nodes; it may have {MAX_NODES}")
        meta = json.loads(row["meta"])
        meta_revs = json.loads(row["meta_revs"])
        name = plan.meta.pop("name", row["name"])
        if name != row["name"]:
            meta_revs["name"] = new
        for key, value in plan.meta.items():
            meta[key] = value
            meta_revs[key] = new
        if meta.get("current") not in live:
            meta["current"] = None
        db.execute(
            "UPDATE stories SET name = ?, revision = ?, next_id = ?, updated = ?, meta = ?,"
            " meta_revs = ? WHERE id = ?",
            (
                name,
                new,
                max(plan.next_id, row["next_id"]),
                time.time(),
                _json(meta),
                _json(meta_revs),
                story_id,
            ),
        )
        self._refresh_stats(db, story_id, meta.get("current"))
        return self._row(db, story_id)

    def _refresh_stats(self, db: sqlite3.Connection, story_id: str, current: int | None) -> None:
        count, size = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM nodes WHERE story = ? AND body IS NOT NULL",
            (story_id,),
        ).fetchone()
        if size > MAX_STORY_BYTES:
            raise StoryTooLarge(
                f"the story would take {size} bytes; a story may take {MAX_STORY_BYTES}"
            )
        # The words of the story as the writer last left it: the current node, else the newest.
        text = db.execute(
            "SELECT json_extract(body, '$.text') FROM nodes WHERE story = ? AND body IS NOT NULL"
            " ORDER BY id = ? DESC, created_rev DESC, id DESC LIMIT 1",
            (story_id, current if current is not None else -1),
        ).fetchone()
        words = _words(text[0]) if text and text[0] else 0
        db.execute(
            "UPDATE stories SET nodes = ?, bytes = ?, words = ? WHERE id = ?",
            (count, size, words, story_id),
        )

    # -- answers ---------------------------------------------------------------------------

    @staticmethod
    def _summary(row: sqlite3.Row) -> dict[str, Any]:
        return {
            "id": row["id"],
            "object": "story",
            "name": row["name"],
            "revision": row["revision"],
            "words": row["words"],
            "node_count": row["nodes"],
            "bytes": row["bytes"],
            "created": _iso(row["created"]),
            "updated": _iso(row["updated"]),
            "opened": _iso(row["opened"]),
            "deleted": _iso(row["deleted"]),
        }

    def _full(self, db: sqlite3.Connection, story_id: str) -> dict[str, Any]:
        row = self._row(db, story_id)
        meta = json.loads(row["meta"])
        nodes = [
            {"id": r["id"], **json.loads(r["body"])}
            for r in db.execute(
                "SELECT id, body FROM nodes WHERE story = ? AND body IS NOT NULL ORDER BY id",
                (story_id,),
            )
        ]
        return {
            **self._summary(row),
            "next_id": row["next_id"],
            "current": meta.get("current"),
            "context": Context(**{k: meta[k] for k in ("memory", "note", "depth")}).model_dump(),
            "settings": meta.get("settings", {}),
            "nodes": nodes,
        }

    def _changes(self, db: sqlite3.Connection, row: sqlite3.Row, since: int) -> dict[str, Any]:
        """Everything changed after revision `since`, as of `row`'s revision."""
        nodes, deleted = [], []
        for r in db.execute(
            "SELECT id, created_rev, body FROM nodes WHERE story = ? AND rev > ? ORDER BY id",
            (row["id"], since),
        ):
            if r["body"] is not None:
                nodes.append({"id": r["id"], **json.loads(r["body"])})
            elif r["created_rev"] <= since:  # made and deleted since: nobody needs to know
                deleted.append(r["id"])
        meta = {**json.loads(row["meta"]), "name": row["name"]}
        fields = {k: v for k, v in meta.items() if json.loads(row["meta_revs"]).get(k, 0) > since}
        return {
            "since": since,
            "revision": row["revision"],
            "next_id": row["next_id"],
            "nodes": nodes,
            "deleted": deleted,
            "fields": fields,
        }


def _name_from(bodies: dict[int, Body]) -> str:
    """A new story's name when none is given: the first words of its first text."""
    first = next((b["text"] for b in bodies.values() if b.get("parent") is None), "")
    words = first.split()
    if not words:
        return "Untitled story"
    name = " ".join(words[:6])
    return name if len(words) <= 6 else f"{name}…"

"""The story library: one SQLite file (WAL, a transaction per write, synced to disk before
a write is confirmed), so a killed server or machine loses nothing it said it had saved.

Each story belongs to one writer (`owner`: an API key's name; owners.py) and only that
writer, or an admin, sees it: to anyone else it does not exist. It has a revision, raised
by every write that changes it; each node remembers the revision that made it and the one
that last changed each of its fields, which is what lets writes from two tabs or devices
merge (merge.py) instead of overwriting each other. Deleted nodes stay as tombstones (id
and revisions, no body) for that reason, the oldest compacted away past MAX_TOMBSTONES;
deleted stories stay in the trash for TRASH_DAYS days, at most MAX_TRASH per writer.

Blocking: call it from a worker thread. Writes take one lock and do work proportional to
what they change, never to the story's size (reads of the whole story happen outside it,
on each thread's own read connection: WAL readers do not block the writer), so a large
story cannot stall the writes of others.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llama_srb.stories.errors import (
    BadStory,
    LibraryFull,
    NotAllowed,
    StoryConflict,
    StoryDeleted,
    StoryExists,
    StoryNotFound,
)
from llama_srb.stories.merge import BadPatch, Plan, plan_patch
from llama_srb.stories.owners import Access
from llama_srb.stories.rows import (
    FIRST_REVS,
    FROM_V1,
    INDEXES,
    NODE_COLUMNS,
    PUT_NODE,
    SCHEMA_VERSION,
    TABLES,
    KnownRows,
    NewNodes,
    Staged,
    compact,
    iso,
    name_from,
    to_json,
    words_now,
)
from llama_srb.stories.schema import (
    MAX_DEPTH,
    MAX_STORIES,
    MAX_TOMBSTONES,
    MAX_TRASH,
    TRASH_DAYS,
    Context,
    StoryDraft,
    StoryPatch,
)

log = logging.getLogger(__name__)

PLAN_TRIES = 3  # plans of a write on a snapshot before it plans under the lock


def new_story_id() -> str:
    return secrets.token_urlsafe(12)


class StoryStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = self._connect()
        self._db.execute("PRAGMA journal_mode = WAL")
        self._local = threading.local()  # each thread's read connection
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._upgrade()
        self.purge_trash()

    def _connect(self) -> sqlite3.Connection:
        # Autocommit mode: every transaction below is an explicit BEGIN … COMMIT.
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        # FULL: a commit is on disk before the write is confirmed (NORMAL could lose the
        # last ones on a power cut; a killed process loses nothing either way).
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("PRAGMA busy_timeout = 5000")
        return db

    def _upgrade(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} was written by a newer llama-srb (schema {version});"
                " upgrade to open it"
            )
        if version == SCHEMA_VERSION:
            return
        with self._write() as db:
            for statement in TABLES if version == 0 else FROM_V1:
                db.execute(statement)
            for statement in INDEXES:
                db.execute(statement)
            if version == 1:
                self._set_depths(db)
                count = db.execute("SELECT COUNT(*) FROM stories").fetchone()[0]
                log.warning(
                    "the story library (%s) now keeps each writer's stories apart: its %d"
                    " stories, made before, belong to the local writer. Without keys, or with"
                    " the keys of one writer, they are yours as before; with several writers'"
                    " keys, an admin key (`admin:name: key`) sees them and can give each to"
                    " its writer (POST /v1/stories/{id}/owner)",
                    self.path,
                    count,
                )
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @staticmethod
    def _set_depths(db: sqlite3.Connection) -> None:
        """Every live node's depth (once, on the upgrade from schema 1)."""
        parents: dict[tuple[str, int], int | None] = {
            (r[0], r[1]): r[2]
            for r in db.execute("SELECT story, id, parent FROM nodes WHERE body IS NOT NULL")
        }
        depth: dict[tuple[str, int], int] = {}
        for key in parents:
            path: list[tuple[str, int]] = []
            at: tuple[str, int] | None = key
            while (
                at is not None and at not in depth and at in parents and len(path) <= len(parents)
            ):
                path.append(at)
                up = parents[at]
                at = None if up is None else (at[0], up)
            below = -1 if at is None or at not in depth else depth[at]
            for node in reversed(path):
                below += 1
                depth[node] = below
        db.executemany(
            "UPDATE nodes SET depth = ? WHERE story = ? AND id = ?",
            ((d, story, node_id) for (story, node_id), d in depth.items()),
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._readers_lock:
            for reader in self._readers:
                reader.close()
            self._readers.clear()

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

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction (a consistent snapshot) on this thread's own connection:
        it neither takes the lock nor waits for writers."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._connect()
            db.execute("PRAGMA query_only = ON")
            with self._readers_lock:
                self._readers.append(db)
            self._local.db = db
        db.execute("BEGIN")
        try:
            yield db
        finally:
            db.execute("COMMIT")

    # -- the library -----------------------------------------------------------------------

    def list(self, who: Access) -> list[dict[str, Any]]:
        """The stories in the library (not the trash) that `who` sees, the last opened first."""
        mine, args = ("", ()) if who.admin else (" AND owner = ?", (who.owner,))
        with self._read() as db:
            rows = db.execute(
                # The story's model read by SQLite: its meta (memory, note…) stays unparsed.
                f"SELECT *, json_extract(meta, '$.model') AS model FROM stories"
                f" WHERE deleted IS NULL{mine}"
                " ORDER BY opened DESC, updated DESC",
                args,
            ).fetchall()
        return [self._summary(row) for row in rows]

    def create(self, draft: StoryDraft, who: Access) -> dict[str, Any]:
        """A new story of `who`'s, whole. Its nodes are checked and serialized before the
        lock is taken: under it, only their rows are written."""
        story_id = draft.id or new_story_id()
        nodes = NewNodes(draft, story_id)
        current = draft.current if draft.current in nodes.bodies else None
        name = draft.name or name_from(nodes.bodies)
        meta = {
            "current": current,
            **draft.context.model_dump(),
            "settings": draft.settings,
            "model": draft.model,
        }
        with self._write() as db:
            if db.execute("SELECT 1 FROM stories WHERE id = ?", (story_id,)).fetchone():
                raise StoryExists(f"a story with the id {story_id!r} exists already")
            self._check_room(db, who.owner)
            self._insert_story(db, story_id, who.owner, name, meta, nodes, time.time())
        return self._whole(story_id, who)

    def get(self, story_id: str, who: Access) -> dict[str, Any]:
        """The whole story; it counts as opened now."""
        story = self._whole(story_id, who)
        now = time.time()
        with self._write() as db:
            db.execute("UPDATE stories SET opened = ? WHERE id = ?", (now, story_id))
        story["opened"] = iso(now)
        return story

    def changes(self, story_id: str, since: int, who: Access) -> dict[str, Any]:
        """What changed after revision `since`: for a writer to catch up."""
        with self._read() as db:
            row = self._live_row(db, story_id, who)
            if not 0 <= since <= row["revision"]:
                raise BadStory(
                    f"since must be between 0 and the story's revision {row['revision']}"
                )
            return self._changes(db, row, since)

    def patch(self, story_id: str, patch: StoryPatch, who: Access) -> dict[str, Any]:
        """Applies a conditional write (merge.py), or raises StoryConflict with nothing
        written. Returns the new revision, the ids renumbered, and the changes since
        the patch's base (its own included).

        The write is planned and its rows built on a snapshot, outside the lock; under it
        only a check that the story is still at that revision, and the rows written. When
        others wrote in between, it is planned again; the last try plans under the lock."""
        for tries in range(PLAN_TRIES, -1, -1):
            plan = self._patch_once(story_id, patch, who, locked=not tries)
            if plan is not None:
                break
        assert plan is not None  # the locked try always lands
        # What changed since the base, read after the commit (outside the lock: it may be
        # the whole story); a write that landed meanwhile is in it too, and its revision.
        with self._read() as db:
            row = self._live_row(db, story_id, who)
            changes = self._changes(db, row, patch.base_revision)
        if plan.conflicts:
            n = len(plan.conflicts)
            raise StoryConflict(
                f"{n} change(s) of this write clash with changes made elsewhere since"
                f" revision {patch.base_revision}; nothing was saved",
                [c.as_json() for c in plan.conflicts],
                changes,
            )
        return {"revision": row["revision"], "renumbered": plan.renumbered, "changes": changes}

    def _patch_once(
        self, story_id: str, patch: StoryPatch, who: Access, locked: bool
    ) -> Plan | None:
        """Plans (and stages) the write, then writes it; None: the story changed after
        the snapshot it was planned on."""
        with self._write() if locked else self._read() as db:
            row = self._live_row(db, story_id, who)
            known = KnownRows(db, row, patch)
            try:
                plan = plan_patch(
                    patch,
                    known,
                    {**json.loads(row["meta"]), "name": row["name"]},
                    json.loads(row["meta_revs"]),
                    row["revision"],
                    row["next_id"],
                )
            except BadPatch as exc:
                raise BadStory(str(exc)) from None
            staged = None if plan.conflicts or plan.empty else Staged(row, known, plan)
            if locked and staged is not None:
                self._commit(db, row, plan, staged)
        if locked or staged is None:
            return plan
        with self._write() as db:
            if self._live_row(db, story_id, who)["revision"] != row["revision"]:
                return None
            self._commit(db, row, plan, staged)
        return plan

    def delete(self, story_id: str, who: Access) -> None:
        """To the trash: `restore` brings it back for TRASH_DAYS days. A trash over
        MAX_TRASH loses its oldest story."""
        with self._write() as db:
            row = self._row(db, story_id, who)
            if row["deleted"] is None:
                db.execute("UPDATE stories SET deleted = ? WHERE id = ?", (time.time(), story_id))
            owner = row["owner"]
        with self._read() as db:
            over = db.execute(
                "SELECT id FROM stories WHERE owner = ? AND deleted IS NOT NULL"
                " ORDER BY deleted DESC LIMIT -1 OFFSET ?",
                (owner, MAX_TRASH),
            ).fetchall()
        self._purge(r["id"] for r in over)

    def restore(self, story_id: str, who: Access) -> dict[str, Any]:
        with self._write() as db:
            row = self._row(db, story_id, who)
            if row["deleted"] is not None:
                self._check_room(db, row["owner"])
                db.execute("UPDATE stories SET deleted = NULL WHERE id = ?", (story_id,))
            return self._summary(self._row(db, story_id, who))

    def duplicate(self, story_id: str, name: str | None, who: Access) -> dict[str, Any]:
        """A new story of `who`'s with the same nodes, memory, note and settings (revision
        1); copied inside SQLite, row for row."""
        with self._write() as db:
            row = self._live_row(db, story_id, who)
            self._check_room(db, who.owner)
            copy_id, now = new_story_id(), time.time()
            meta = json.loads(row["meta"])
            db.execute(
                "INSERT INTO stories (id, owner, name, revision, next_id, created, updated,"
                " opened, deleted, words, nodes, bytes, meta, meta_revs)"
                " VALUES (?, ?, ?, 1, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)",
                (
                    copy_id,
                    who.owner,
                    name or f"{row['name']} (copy)",
                    row["next_id"],
                    now,
                    now,
                    now,
                    row["words"],
                    row["nodes"],
                    row["bytes"],
                    to_json(meta),
                    to_json(dict.fromkeys(["name", *meta], 1)),
                ),
            )
            db.execute(
                f"INSERT INTO nodes ({NODE_COLUMNS}) SELECT ?, id, 1, 1, parent, size, body,"
                " ?, depth FROM nodes WHERE story = ? AND body IS NOT NULL",
                (copy_id, FIRST_REVS, story_id),
            )
            return self._summary(self._row(db, copy_id, who))

    def give(self, story_id: str, owner: str, who: Access) -> dict[str, Any]:
        """An admin hands a story to another writer (a story made before owners, say)."""
        with self._write() as db:
            row = self._row(db, story_id, who)
            if not who.admin:
                raise NotAllowed("only an admin key may give a story to another writer")
            if row["owner"] != owner and row["deleted"] is None:
                self._check_room(db, owner)
            db.execute("UPDATE stories SET owner = ? WHERE id = ?", (owner, story_id))
            return self._summary(self._row(db, story_id, who))

    def empty_trash(self, who: Access) -> int:
        """Forget every story in `who`'s trash (an admin's: every trash) now."""
        mine, args = ("", ()) if who.admin else (" AND owner = ?", (who.owner,))
        with self._read() as db:
            rows = db.execute(
                f"SELECT id FROM stories WHERE deleted IS NOT NULL{mine}", args
            ).fetchall()
        return self._purge(r["id"] for r in rows)

    def purge_trash(self, now: float | None = None) -> int:
        """Forget the stories deleted more than TRASH_DAYS days ago."""
        cutoff = (now or time.time()) - TRASH_DAYS * 86_400
        with self._read() as db:
            rows = db.execute(
                "SELECT id FROM stories WHERE deleted IS NOT NULL AND deleted < ?", (cutoff,)
            ).fetchall()
        return self._purge(r["id"] for r in rows)

    def _purge(self, story_ids: Iterable[str]) -> int:
        """Forget stories of the trash, one transaction each (the lock is let go between
        them), and only while they are still in the trash."""
        purged = 0
        for story_id in story_ids:
            with self._write() as db:
                purged += db.execute(
                    "DELETE FROM stories WHERE id = ? AND deleted IS NOT NULL", (story_id,)
                ).rowcount
        return purged

    def integrity(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])

    # -- rows ------------------------------------------------------------------------------

    def _row(self, db: sqlite3.Connection, story_id: str, who: Access) -> sqlite3.Row:
        """The story's row, if `who` may see it: to anyone else it does not exist."""
        row = db.execute("SELECT * FROM stories WHERE id = ?", (story_id,)).fetchone()
        if row is None or not who.sees(row["owner"]):
            raise StoryNotFound(f"no story with the id {story_id!r}")
        return row

    def _live_row(self, db: sqlite3.Connection, story_id: str, who: Access) -> sqlite3.Row:
        row = self._row(db, story_id, who)
        if row["deleted"] is not None:
            raise StoryDeleted(
                f"the story {row['name']!r} is in the trash: restore it"
                f" (POST /v1/stories/{story_id}/restore) to open or change it"
            )
        return row

    @staticmethod
    def _check_room(db: sqlite3.Connection, owner: str) -> None:
        count = db.execute(
            "SELECT COUNT(*) FROM stories WHERE owner = ? AND deleted IS NULL", (owner,)
        ).fetchone()[0]
        if count >= MAX_STORIES:
            raise LibraryFull(
                f"your library holds {count} stories, its limit ({MAX_STORIES}): delete some"
                " (the trash does not count)"
            )

    def _insert_story(
        self,
        db: sqlite3.Connection,
        story_id: str,
        owner: str,
        name: str,
        meta: dict[str, Any],
        nodes: NewNodes,
        now: float,
    ) -> None:
        revs = dict.fromkeys(["name", *meta], 1)
        db.execute(
            "INSERT INTO stories (id, owner, name, revision, next_id, created, updated, opened,"
            " deleted, words, nodes, bytes, meta, meta_revs)"
            " VALUES (?, ?, ?, 1, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)",
            (
                story_id,
                owner,
                name,
                max(nodes.bodies, default=0) + 1,
                now,
                now,
                now,
                nodes.words(meta.get("current")),
                len(nodes.rows),
                nodes.size,
                to_json(meta),
                to_json(revs),
            ),
        )
        db.executemany(PUT_NODE, nodes.rows)

    def _commit(self, db: sqlite3.Connection, row: sqlite3.Row, plan: Plan, staged: Staged) -> None:
        """Writes a staged plan: its rows, then the story's own row."""
        story_id = row["id"]
        db.executemany(PUT_NODE, staged.rows)
        for moved in plan.moved:
            self._redepth(db, story_id, moved, plan.writes[moved].depth)
        words = row["words"]
        if staged.recount_words:
            words = words_now(db, story_id, staged.meta.get("current"))
        floor, tombstones = row["floor"], staged.tombstones
        if tombstones > MAX_TOMBSTONES:
            floor, tombstones = compact(db, story_id, floor, tombstones, MAX_TOMBSTONES // 2)
        db.execute(
            "UPDATE stories SET name = ?, revision = ?, next_id = ?, updated = ?, meta = ?,"
            " meta_revs = ?, nodes = ?, bytes = ?, words = ?, tombstones = ?, floor = ?"
            " WHERE id = ?",
            (
                staged.name,
                row["revision"] + 1,
                max(plan.next_id, row["next_id"]),
                time.time(),
                to_json(staged.meta),
                to_json(staged.meta_revs),
                staged.count,
                staged.size,
                words,
                tombstones,
                floor,
                story_id,
            ),
        )

    @staticmethod
    def _redepth(db: sqlite3.Connection, story_id: str, moved: int, depth: int) -> None:
        """A node moved under another parent: the depths of what grows from it."""
        below = db.execute(
            "WITH RECURSIVE sub(id, depth) AS (SELECT ?, ? UNION ALL"
            " SELECT n.id, sub.depth + 1 FROM nodes AS n INDEXED BY nodes_children JOIN sub"
            " ON n.story = ? AND n.parent = sub.id AND n.body IS NOT NULL"
            f" WHERE sub.depth < {MAX_DEPTH + 1})"
            " SELECT id, depth FROM sub",
            (moved, depth, story_id),
        ).fetchall()
        deepest = max(r["depth"] for r in below)
        if deepest > MAX_DEPTH:
            raise BadStory(
                f"moving node {moved} would put nodes {deepest} deep:"
                f" a story may be at most {MAX_DEPTH} deep"
            )
        db.executemany(
            "UPDATE nodes SET depth = ? WHERE story = ? AND id = ?",
            ((r["depth"], story_id, r["id"]) for r in below),
        )

    # -- answers ---------------------------------------------------------------------------

    @staticmethod
    def _summary(row: sqlite3.Row) -> dict[str, Any]:
        # The listing's column, else read from the meta (a Row's `in` looks at its values).
        has_model = "model" in row.keys()  # noqa: SIM118
        model = row["model"] if has_model else json.loads(row["meta"]).get("model")
        return {
            "id": row["id"],
            "object": "story",
            "name": row["name"],
            "owner": row["owner"] or None,  # None: the local writer's
            "revision": row["revision"],
            "words": row["words"],
            "node_count": row["nodes"],
            "bytes": row["bytes"],
            "created": iso(row["created"]),
            "updated": iso(row["updated"]),
            "opened": iso(row["opened"]),
            "deleted": iso(row["deleted"]),
            "model": model,  # None: the server's current model
        }

    def _whole(self, story_id: str, who: Access) -> dict[str, Any]:
        """The whole story, read outside the lock."""
        with self._read() as db:
            row = self._live_row(db, story_id, who)
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
            "model": meta.get("model"),  # None: the server's current model (and older stories)
            "nodes": nodes,
        }

    def _changes(self, db: sqlite3.Connection, row: sqlite3.Row, since: int) -> dict[str, Any]:
        """Everything changed after revision `since`, as of `row`'s revision. Before the
        story's compaction floor the deletions are no longer known: then the answer is the
        whole story (`whole`: every node not in it is gone)."""
        whole = since < row["floor"]
        nodes, deleted = [], []
        query = "SELECT id, created_rev, body FROM nodes"
        if whole:
            query += " WHERE story = ? AND body IS NOT NULL ORDER BY id"
        else:  # by revision: what changed since, not the story
            query += " INDEXED BY nodes_by_rev WHERE story = ? AND rev > ? ORDER BY id"
        for r in db.execute(query, (row["id"],) if whole else (row["id"], since)):
            if r["body"] is not None:
                nodes.append({"id": r["id"], **json.loads(r["body"])})
            elif r["created_rev"] <= since:  # made and deleted since: nobody needs to know
                deleted.append(r["id"])
        meta = {**json.loads(row["meta"]), "name": row["name"]}
        revs = json.loads(row["meta_revs"])
        fields = {k: v for k, v in meta.items() if whole or revs.get(k, 0) > since}
        answer = {
            "since": since,
            "revision": row["revision"],
            "next_id": row["next_id"],
            "nodes": nodes,
            "deleted": deleted,
            "fields": fields,
        }
        return {**answer, "whole": True} if whole else answer

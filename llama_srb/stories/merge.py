"""A conditional write, planned: which of a patch's changes apply, which nodes it adds
under new ids, and which clash with what others wrote since the writer's base revision.

Pure: it asks what the store knows about the nodes the patch touches (`Known`: a node's
`Slot`, when it was made and when each of its fields last changed; its body; its live
children) and returns a `Plan` that the store then writes in one transaction, or refuses
whole. It never reads the whole story: its work is proportional to the patch (and, for a
node moved under another, to the depth of the tree), so one large story cannot make a
small write to it slow.

The rules (docs/library.md):
- a field changes unless someone else changed it to another value after the base
  revision (that is a conflict); the same value from both sides is no conflict;
- a node the writer could not have seen (made after its base) never collides with the
  writer's new node of the same id: the writer's node gets the next free id instead;
- deleting a node someone else changed after the base, changing a node someone else
  deleted, and adding under a node someone else deleted (or deleting one under which
  someone else added) are conflicts;
- `name`, `current` and `model` are last-writer-wins: they never conflict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from llama_srb.stories.schema import MAX_DEPTH, Node, StoryPatch

Body = dict[str, Any]


class BadPatch(ValueError):
    """The patch contradicts itself or the story as the writer saw it: a 400."""


@dataclass
class Slot:
    """A node id of a story, without its body: live or deleted (a tombstone)."""

    id: int
    created_rev: int
    rev: int  # the last revision that changed it
    parent: int | None
    live: bool
    size: int  # bytes of its body's JSON
    revs: dict[str, int]  # per field, the revision that last changed it
    depth: int = 0  # ancestors it has (a root: 0)

    def field_rev(self, name: str) -> int:
        return self.revs.get(name, self.created_rev)


class Known(Protocol):
    """What the store knows of one story's nodes, read only as the plan asks."""

    def slot(self, node_id: int) -> Slot | None: ...

    def body(self, node_id: int) -> Body: ...

    def children(self, node_id: int) -> list[Slot]:
        """The live nodes whose parent it is, as stored."""
        ...


@dataclass(frozen=True)
class Conflict:
    """`kind`: "changed" (both sides changed it), "deleted" (changed or extended here,
    deleted there) or "grown" (deleted here, added to there)."""

    kind: str
    node: int | None = None
    field: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "field": self.field}


@dataclass
class Write:
    """A node's new state: `body` None deletes it."""

    id: int
    body: Body | None
    revs: dict[str, int]
    created_rev: int
    depth: int = 0  # set by the plan for a live node


@dataclass
class Plan:
    writes: dict[int, Write] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # changed story fields
    renumbered: dict[int, int] = field(default_factory=dict)  # the writer's id -> stored id
    conflicts: list[Conflict] = field(default_factory=list)
    next_id: int = 1
    moved: list[int] = field(default_factory=list)  # stored nodes put under another parent

    @property
    def empty(self) -> bool:
        return not self.writes and not self.meta


def plan_patch(
    patch: StoryPatch,
    known: Known,
    meta: dict[str, Any],
    meta_revs: dict[str, int],
    revision: int,
    next_id: int,
) -> Plan:
    """The plan for `patch` against a story at `revision` whose nodes are `known` and
    whose story fields are `meta` (changed at `meta_revs`)."""
    base = patch.base_revision
    if base > revision:
        raise BadPatch(
            f"base_revision {base} is ahead of the story, which is at revision {revision}"
        )
    if set(patch.deleted) & {n.id for n in patch.nodes}:
        raise BadPatch("a node cannot be both sent and deleted in one patch")
    new = revision + 1
    plan = Plan(next_id=next_id)
    for node in _renumbered(patch, known, plan):
        _plan_node(node, known, base, new, plan)
    for node_id in sorted(set(patch.deleted)):
        slot = known.slot(node_id)
        if slot is None or slot.created_rev > base or not slot.live:
            continue  # never seen by the writer, or already gone: nothing to do
        if slot.rev > base:
            plan.conflicts.append(Conflict("changed", node_id))
        else:
            plan.writes[node_id] = Write(node_id, None, {}, slot.created_rev)
    _plan_meta(patch, meta, meta_revs, base, plan)
    if "current" in patch.model_fields_set and patch.current is not None:
        plan.meta["current"] = plan.renumbered.get(patch.current, patch.current)
    _check_structure(known, plan, base)
    return plan


def _renumbered(patch: StoryPatch, known: Known, plan: Plan) -> list[Node]:
    """The patch's nodes, those the writer made under an id someone else took since its
    base moved to new ids, and every reference to them (parent, retry_of…) with them. A
    node identical to the one made there is that node: the writer sends again a write
    whose answer it never got."""
    seen: set[int] = set()
    for node in patch.nodes:
        if node.id in seen:
            raise BadPatch(f"node {node.id} is sent twice")
        seen.add(node.id)
        slot = known.slot(node.id)
        if slot is None or slot.created_rev <= patch.base_revision:
            continue
        if not (slot.live and known.body(node.id) == node.body()):
            plan.renumbered[node.id] = 0  # numbered below, past every id in use
    taken = max([plan.next_id - 1, *seen], default=0)  # next_id is past every stored id
    for old in plan.renumbered:
        taken += 1
        plan.renumbered[old] = taken
    plan.next_id = taken + 1
    if not plan.renumbered:
        return list(patch.nodes)
    moved = plan.renumbered
    out = []
    for node in patch.nodes:
        changes = {"id": moved.get(node.id, node.id)}
        for ref in ("parent", "retry_of", "via_node"):
            value = getattr(node, ref)
            if value in moved and ref in node.model_fields_set:
                changes[ref] = moved[value]
        copy = node.model_copy(update=changes)
        copy.__pydantic_fields_set__ = set(node.model_fields_set)  # what was sent, still
        out.append(copy)
    return out


def _plan_node(node: Node, known: Known, base: int, new: int, plan: Plan) -> None:
    slot = known.slot(node.id)
    sent = node.sent()
    if slot is None or not slot.live:
        if slot is not None and slot.rev > base:
            plan.conflicts.append(Conflict("deleted", node.id))
            return
        if "text" not in sent:
            raise BadPatch(f"node {node.id} is new here: send its text (and its other fields)")
        body = node.body()
        created = new if slot is None else slot.created_rev
        plan.writes[node.id] = Write(node.id, body, dict.fromkeys(body, new), created)
        plan.next_id = max(plan.next_id, node.id + 1)
        return
    body = known.body(node.id)
    changed = {k: v for k, v in sent.items() if body.get(k) != v}
    clashes = [k for k in changed if slot.field_rev(k) > base]
    if clashes:
        plan.conflicts += [Conflict("changed", node.id, k) for k in clashes]
        return
    if changed:
        revs = {**slot.revs, **dict.fromkeys(changed, new)}
        plan.writes[node.id] = Write(node.id, {**body, **changed}, revs, slot.created_rev)
        if "parent" in changed:
            plan.moved.append(node.id)


def _plan_meta(
    patch: StoryPatch, meta: dict[str, Any], meta_revs: dict[str, int], base: int, plan: Plan
) -> None:
    merged: dict[str, Any] = {}
    if patch.context is not None:
        merged.update(patch.context.model_dump(include=set(patch.context.model_fields_set)))
    if patch.settings is not None:
        merged["settings"] = patch.settings
    for key, value in merged.items():
        if value is None or meta.get(key) == value:
            continue
        if meta_revs.get(key, 0) > base:
            plan.conflicts.append(Conflict("changed", field=key))
        else:
            plan.meta[key] = value
    if patch.name is not None and patch.name != meta.get("name"):
        plan.meta["name"] = patch.name
    # The story's model: sent (null or "" forgets it), and not what it is already.
    if "model" in patch.model_fields_set and patch.model != meta.get("model"):
        plan.meta["model"] = patch.model


def live_after(known: Known, plan: Plan, node_id: int) -> bool:
    """Whether a node is live once the plan is written."""
    write = plan.writes.get(node_id)
    if write is not None:
        return write.body is not None
    slot = known.slot(node_id)
    return slot is not None and slot.live


def _check_structure(known: Known, plan: Plan, base: int) -> None:
    """After the plan, every live node's parent is live, no node is its own ancestor and
    none is deeper than MAX_DEPTH; each written node's depth is set. A parent deleted by
    someone else after the base is a conflict, any other missing parent a bad patch."""

    written = [w for w in plan.writes.values() if w.body is not None]
    for write in written:
        assert write.body is not None
        up = write.body.get("parent")
        if up is None or live_after(known, plan, up):
            continue
        up_slot = known.slot(up)
        if up_slot is not None and up_slot.rev > base:
            plan.conflicts.append(Conflict("deleted", up))
        else:
            raise BadPatch(f"node {write.id}'s parent {up} is not in the story")
    for gone in [w.id for w in plan.writes.values() if w.body is None]:
        for child in known.children(gone):
            if child.id in plan.writes:
                continue  # deleted too, or moved: its new parent is checked above
            if child.created_rev > base or child.field_rev("parent") > base:
                plan.conflicts.append(Conflict("grown", gone))
            else:
                raise BadPatch(f"deleting node {gone} leaves node {child.id} without its parent")
    plan.conflicts = list(dict.fromkeys(plan.conflicts))  # once each
    if not plan.conflicts:
        _set_depths(known, plan, written)


def _set_depths(known: Known, plan: Plan, written: list[Write]) -> None:
    """Each written node's depth, from its parent's; a cycle or a node deeper than
    MAX_DEPTH is a bad patch. A stored node's depth is as stored unless the patch moves
    one of its ancestors: only then is the walk continued through stored nodes."""
    depth: dict[int, int] = {}

    def parent(node_id: int) -> int | None:
        write = plan.writes.get(node_id)
        if write is not None and write.body is not None:
            up: int | None = write.body.get("parent")
            return up
        slot = known.slot(node_id)
        return slot.parent if slot is not None else None

    for start in written:
        path: list[int] = []
        on_path: set[int] = set()
        at: int | None = start.id
        while at is not None and at not in depth:
            if at not in plan.writes and not plan.moved:
                slot = known.slot(at)
                depth[at] = slot.depth if slot is not None else 0
                break
            if at in on_path:
                raise BadPatch(f"node {start.id} would be its own ancestor")
            path.append(at)
            on_path.add(at)
            at = parent(at)
        below = -1 if at is None else depth[at]
        for node_id in reversed(path):
            below += 1
            depth[node_id] = below
        if depth[start.id] > MAX_DEPTH:
            raise BadPatch(
                f"node {start.id} would be {depth[start.id]} nodes below its story's first:"
                f" a story may be at most {MAX_DEPTH} deep (start a new story from it)"
            )
        start.depth = depth[start.id]

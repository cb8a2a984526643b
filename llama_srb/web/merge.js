// How copies of one story meet (docs/library.md): the patch that turns the server's copy
// into the writer's (what a save sends), the server's changes applied to a copy, and the
// three-way merge of others' changes into the writer's tree, which names what clashes.
// Pure: trees in, trees (changed in place) and lists out; no DOM, no network.

import * as Tree from "./tree.js";

export const CONTEXT_FIELDS = ["memory", "note", "depth"];

/** The patch from `base` (the server's copy; null: it has none yet) to `mine`: nodes new or
 * changed (new ones whole, others by the fields that changed), nodes deleted, and the
 * story's fields that changed. */
export function diff(base, mine) {
  const patch = { nodes: [], deleted: [] };
  for (const node of mine.nodes.values()) {
    const was = base?.nodes.get(node.id);
    if (!was) {
      patch.nodes.push(Tree.cloneNode(node));
      continue;
    }
    const fields = Tree.NODE_FIELDS.filter((f) => !Tree.equal(node[f], was[f]));
    if (fields.length) patch.nodes.push(pick(node, ["id", ...fields]));
  }
  if (base) for (const id of base.nodes.keys()) if (!mine.nodes.has(id)) patch.deleted.push(id);
  const context = {};
  for (const f of CONTEXT_FIELDS) {
    if (!base || mine.context[f] !== base.context[f]) context[f] = mine.context[f];
  }
  if (Object.keys(context).length) patch.context = context;
  if (!base || !Tree.equal(mine.settings, base.settings)) patch.settings = mine.settings;
  if (mine.name && mine.name !== base?.name) patch.name = mine.name;
  // The model: null forgets the pick (a new story sends one only if picked).
  if ((mine.model ?? null) !== (base?.model ?? null)) patch.model = mine.model ?? null;
  if (mine.current !== (base?.current ?? null)) patch.current = mine.current;
  return patch;
}

export function isEmpty(patch) {
  return (
    patch.nodes.length === 0 &&
    patch.deleted.length === 0 &&
    ["context", "settings", "name", "current", "model"].every((k) => !(k in patch))
  );
}

/** `tree` with `patch` applied (in place): what the server holds once it took the patch. */
export function applyPatch(tree, patch) {
  for (const sent of patch.nodes) {
    const node = tree.nodes.get(sent.id);
    if (node) Object.assign(node, Tree.cloneNode({ choices: node.choices, ...sent }));
    else tree.nodes.set(sent.id, Tree.cloneNode(sent));
  }
  for (const id of patch.deleted) tree.nodes.delete(id);
  if (patch.context) Object.assign(tree.context, patch.context);
  if ("settings" in patch) tree.settings = patch.settings;
  if ("name" in patch) tree.name = patch.name;
  if ("model" in patch) tree.model = patch.model;
  if ("current" in patch) tree.current = patch.current;
  return tree;
}

/** `tree` with the server's `changes` applied (in place): whole nodes, deleted ids, and
 * the story's fields (`fields`: name, current, memory, note, depth, settings, model). */
export function applyChanges(tree, changes) {
  const deleted = deletedFrom(tree, changes);
  for (const raw of changes.nodes) tree.nodes.set(raw.id, Tree.readNode(raw));
  for (const id of deleted) tree.nodes.delete(id);
  const fields = changes.fields ?? {};
  for (const f of CONTEXT_FIELDS) if (f in fields) tree.context[f] = fields[f];
  if ("settings" in fields) tree.settings = fields.settings;
  if ("name" in fields) tree.name = fields.name;
  if ("model" in fields) tree.model = fields.model ?? null;
  if ("current" in fields) tree.current = fields.current;
  Tree.bumpNextId(tree, changes.next_id ?? 0);
  return tree;
}

/** The ids `changes` deletes from `tree`: those listed, and, when the server sent the whole
 * story (`whole`: it no longer remembers deletions that old), every node it does not have. */
function deletedFrom(tree, changes) {
  if (!changes.whole) return changes.deleted;
  const kept = new Set(changes.nodes.map((raw) => raw.id));
  return [...tree.nodes.keys()].filter((id) => !kept.has(id));
}

/** A whole story from the server as changes from nothing (for a copy that has none). */
export function asChanges(story) {
  const fields = {
    name: story.name, current: story.current, settings: story.settings, model: story.model ?? null,
  };
  for (const f of CONTEXT_FIELDS) fields[f] = story.context[f];
  return {
    since: 0, revision: story.revision, next_id: story.next_id, nodes: story.nodes, deleted: [],
    fields,
  };
}

/**
 * Merges others' `changes` (made to `base`) into `mine`, in place: what only they changed
 * is taken, what only the writer changed is kept, and what both changed to different
 * values is a conflict. Their new nodes under ids the writer's own new nodes hold push
 * the writer's aside (`moves`). Returns the server's copy (`theirs`: base + changes), the
 * conflicts, the moves and whether `mine` changed. Which node is shown (`current`) is
 * each page's own.
 */
export function rebase(base, mine, changes) {
  const theirs = applyChanges(Tree.clone(base), changes);
  const moves = makeRoom(base, mine, theirs, changes);
  const conflicts = [];
  let changed = moves.size > 0; // whether `mine` took anything of theirs
  const clash = (conflict) => {
    const key = `${conflict.kind}:${conflict.node}:${conflict.field}`;
    if (!conflicts.some((c) => `${c.kind}:${c.node}:${c.field}` === key)) conflicts.push(conflict);
  };
  for (const raw of changes.nodes) {
    const t = theirs.nodes.get(raw.id);
    const b = base.nodes.get(raw.id);
    const m = mine.nodes.get(raw.id);
    if (!b) {
      if (!m) {
        mine.nodes.set(t.id, copy(t));
        changed = true;
      }
    } else if (!m) {
      // Deleted here: a clash only if it changed there. The answer to this page's own
      // save of it, made before the writer deleted it, is no change of theirs.
      if (!Tree.sameNode(t, b)) clash({ kind: "deleted-here", node: t.id });
    } else {
      for (const f of Tree.NODE_FIELDS) {
        if (Tree.equal(t[f], b[f])) continue;
        if (Tree.equal(m[f], b[f])) {
          m[f] = copy(t[f]); // the writer's own from now on: nothing shared with theirs
          changed = true;
        } else if (!Tree.equal(m[f], t[f])) clash({ kind: "field", node: t.id, field: f, theirs: t[f] });
      }
    }
  }
  for (const id of deletedFrom(base, changes)) {
    const b = base.nodes.get(id);
    const m = mine.nodes.get(id);
    // Not in the base: this page's own save deleted it, and the writer has it back since
    // (Undo): the writer's, sent again by the next save.
    if (!m || !b) continue;
    if (Tree.sameNode(m, b)) changed = mine.nodes.delete(id);
    else clash({ kind: "deleted-there", node: id });
  }
  const fields = changes.fields ?? {};
  for (const f of CONTEXT_FIELDS) {
    if (!(f in fields) || Tree.equal(fields[f], base.context[f])) continue;
    if (Tree.equal(mine.context[f], base.context[f])) {
      mine.context = { ...mine.context, [f]: fields[f] };
      changed = true;
    } else if (!Tree.equal(mine.context[f], fields[f])) clash({ kind: "meta", field: f, theirs: fields[f] });
  }
  if ("settings" in fields && !Tree.equal(fields.settings, base.settings)) {
    if (Tree.equal(mine.settings, base.settings)) {
      mine.settings = copy(fields.settings);
      changed = true;
    } else if (!Tree.equal(mine.settings, fields.settings)) {
      clash({ kind: "meta", field: "settings", theirs: fields.settings });
    }
  }
  // The name: the last writer's, unless this writer renamed it too (then its own).
  if ("name" in fields && mine.name === base.name && mine.name !== fields.name) {
    mine.name = fields.name;
    changed = true;
  }
  // The model likewise: the last pick, unless this writer picked one too.
  const model = (tree) => tree.model ?? null;
  if ("model" in fields && model(mine) === model(base) && model(mine) !== (fields.model ?? null)) {
    mine.model = fields.model ?? null;
    changed = true;
  }
  // A node whose parent is gone: the parent was deleted on one side, added to on the other.
  for (const node of mine.nodes.values()) {
    if (node.parent === null || mine.nodes.has(node.parent)) continue;
    const kind = theirs.nodes.has(node.parent) ? "deleted-here" : "deleted-there";
    clash({ kind, node: node.parent });
  }
  Tree.bumpNextId(mine, theirs.nextId);
  return { theirs, conflicts, moves, changed: changed || conflicts.length > 0 };
}

/** The writer's new nodes that hold ids the server gave to others' new nodes move to free
 * ids first; one identical to theirs is the same node (a save whose answer was lost). */
function makeRoom(base, mine, theirs, changes) {
  const wanted = new Map();
  let free = Math.max(Tree.freeId(mine), Tree.freeId(theirs));
  for (const raw of changes.nodes) {
    const m = mine.nodes.get(raw.id);
    if (m && !base.nodes.has(raw.id) && !Tree.sameNode(m, theirs.nodes.get(raw.id))) {
      wanted.set(raw.id, free++);
    }
  }
  return wanted.size ? Tree.renumber(mine, wanted) : new Map();
}

/**
 * Settles `conflicts` in `mine` (in place) with one `answer` for all: "mine" keeps the
 * writer's side, "theirs" takes the other side, "both" keeps everything (the writer's
 * version of a node both changed becomes a sibling copy; a branch deleted on one side and
 * changed or grown on the other comes back). `base` and `theirs` are the two sides' origins.
 */
export function resolve(mine, base, theirs, conflicts, answer) {
  const copied = new Set();
  for (const c of conflicts) {
    if (c.kind === "meta") {
      if (answer === "theirs") {
        if (c.field === "settings") mine.settings = copy(c.theirs);
        else mine.context = { ...mine.context, [c.field]: c.theirs };
      }
    } else if (c.kind === "field") {
      const node = mine.nodes.get(c.node);
      if (!node || answer === "mine") continue;
      if (answer === "both" && !copied.has(node.id)) {
        copied.add(node.id);
        const twin = { ...Tree.cloneNode(node), id: mine.nextId };
        mine.nodes.set(twin.id, twin);
        Tree.bumpNextId(mine);
      }
      node[c.field] = copy(c.theirs);
    } else if (c.kind === "deleted-here") {
      // The writer deleted it; the other side changed it or grew a branch under it.
      if (answer === "mine") Tree.deleteSubtree(mine, c.node);
      else restoreChain(mine, theirs, c.node);
    } else if (c.kind === "deleted-there") {
      if (answer === "theirs") Tree.deleteSubtree(mine, c.node);
      else restoreChain(mine, base, c.node);
    }
  }
  Tree.bumpNextId(mine);
}

/** Puts node `id` (and any of its ancestors missing too) back into `tree` from `source`. */
function restoreChain(tree, source, id) {
  let at = id;
  while (at !== null && at !== undefined && !tree.nodes.has(at)) {
    const node = source.nodes.get(at);
    if (!node) return;
    tree.nodes.set(at, copy(node));
    at = node.parent;
  }
}

function copy(value) {
  return value !== null && typeof value === "object" ? structuredClone(value) : value;
}

function pick(object, keys) {
  return Object.fromEntries(keys.map((k) => [k, object[k]]));
}

/** What a conflict is about, in words, for the question the page asks. */
export function describe(conflict) {
  const what = {
    choices: "its continuations", text: "its text", bookmarked: "its bookmark",
    params: "its settings", parent: "where it hangs", stats: "its timing",
  };
  switch (conflict.kind) {
    case "meta":
      return conflict.field === "settings" ? "the settings" : `the ${conflict.field === "note" ? "author's note" : conflict.field}`;
    case "field":
      return `#${conflict.node}: ${what[conflict.field] ?? conflict.field}`;
    case "deleted-here":
      return `#${conflict.node}, which you deleted, was changed or added to there`;
    default:
      return `#${conflict.node}, which you changed or added to, was deleted there`;
  }
}

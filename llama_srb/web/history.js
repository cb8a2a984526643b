// Undo and redo, as what each change did: an entry holds, for the nodes and story fields a
// change touched, their values just before it. Undo puts those back (and keeps what it
// replaced, for redo), so it undoes the writer's own change only, never what another tab
// merged in meanwhile. Entries are plain data: the page keeps them with the story's copy
// in the browser (cache.js), so undo survives a reload. The last LIMIT changes.

import * as Tree from "./tree.js";

const LIMIT = 100;

export function createHistory() {
  return { past: [], future: [], pending: null };
}

/** Call before changing the tree; `commit` once the change is made. Returns a token for
 * `forget`. */
export function record(history, tree) {
  commit(history, tree);
  history.pending = { before: Tree.clone(tree), entry: null };
  return history.pending;
}

/** Turns the pending record into an entry: what differs between then and `tree` now. */
export function commit(history, tree) {
  const pending = history.pending;
  if (!pending) return;
  history.pending = null;
  const entry = entryOf(pending.before, tree);
  if (!entry) return;
  entry.id = newId();
  pending.entry = entry;
  history.past.push(entry);
  if (history.past.length > LIMIT) history.past.shift();
  history.future = [];
}

/** Drops the change recorded with `token` if it is the latest (it did not happen after all). */
export function forget(history, token) {
  if (history.pending === token) history.pending = null;
  else if (token?.entry && history.past[history.past.length - 1] === token.entry) history.past.pop();
}

export function canUndo(history) {
  return history.past.length > 0 || history.pending !== null;
}

/** Undoes the latest change in `tree` (in place); false if there is none. */
export function undo(history, tree) {
  commit(history, tree);
  return step(history.past, history.future, tree);
}

export function redo(history, tree) {
  commit(history, tree);
  return step(history.future, history.past, tree);
}

/** After the server gave nodes new ids: the entries follow them. */
export function renumber(history, moves) {
  const to = (id) => (moves.has(id) ? moves.get(id) : id);
  for (const entry of [...history.past, ...history.future]) {
    entry.nodes = entry.nodes.map(([id, node]) => {
      if (node) {
        node.id = to(node.id);
        if (node.parent !== null) node.parent = to(node.parent);
        if (node.retry_of !== null) node.retry_of = to(node.retry_of);
        if (node.via_node != null) node.via_node = to(node.via_node);
      }
      return [to(id), node];
    });
    if (entry.current !== null) entry.current = to(entry.current);
  }
}

/** Names the history's state: the page keeps it where a write cannot be lost (local
 * storage) to tell a copy of the history that lags behind (IndexedDB) from a current one. */
export function fingerprint(history) {
  const last = (list) => list[list.length - 1]?.id ?? "";
  return `${history.past.length}:${last(history.past)}/${history.future.length}:${last(history.future)}`;
}

function newId() {
  return `${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

function step(from, to, tree) {
  const entry = from.pop();
  if (!entry) return false;
  to.push({ ...capture(tree, entry), id: newId() });
  apply(tree, entry);
  return true;
}

/** The nodes and fields that differ between `before` and `after`, with their values before. */
function entryOf(before, after) {
  const nodes = [];
  for (const [id, node] of before.nodes) {
    const now = after.nodes.get(id);
    if (!now || !Tree.sameNode(node, now)) nodes.push([id, node]);
  }
  for (const id of after.nodes.keys()) if (!before.nodes.has(id)) nodes.push([id, null]);
  const fields = {};
  if (!Tree.equal(before.context, after.context)) fields.context = { ...before.context };
  if (!Tree.equal(before.settings, after.settings)) fields.settings = before.settings;
  if (nodes.length === 0 && Object.keys(fields).length === 0) return null;
  return { nodes, ...fields, current: before.current };
}

/** What `tree` holds now of what `entry` touches: the entry that takes it back. */
function capture(tree, entry) {
  const nodes = entry.nodes.map(([id]) => {
    const node = tree.nodes.get(id);
    return [id, node ? Tree.cloneNode(node) : null];
  });
  const fields = {};
  if (entry.context) fields.context = { ...tree.context };
  if ("settings" in entry) fields.settings = tree.settings;
  return { nodes, ...fields, current: tree.current };
}

function apply(tree, entry) {
  const going = new Set(entry.nodes.filter(([, node]) => node === null).map(([id]) => id));
  for (const [id, node] of entry.nodes) {
    if (node) tree.nodes.set(id, Tree.cloneNode(node));
  }
  // A node to take back stays if something not taken back grew from it since (another
  // tab's branch, merged in): undo never leaves a node without its parent.
  for (let grew = true; grew; ) {
    grew = false;
    for (const node of tree.nodes.values()) {
      if (going.has(node.parent) && !going.has(node.id)) grew = going.delete(node.parent);
    }
  }
  for (const id of going) tree.nodes.delete(id);
  if (entry.context) tree.context = { ...entry.context };
  if ("settings" in entry) tree.settings = entry.settings;
  tree.current = tree.nodes.has(entry.current) ? entry.current : null;
  Tree.bumpNextId(tree);
}

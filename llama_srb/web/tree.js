// The story tree: pure data, no DOM. Every node holds a story text and the n continuations
// generated from it. A child starts from its parent's text plus a continuation the writer
// accepted (`via`: its index; `model_chars`: how much of the added text the model wrote;
// `via_node`: whose card it was, when not the parent's: a card used after an edit), or from
// the writer's own edit (`via` null). A retry is a sibling with the same text (`retry_of`).
// Kept flat (id → node) so it serializes to JSON as it is. A tree is one story: its name,
// memory and note (`context`), the settings form's values and the model the writer picked
// for it (`model`: null, the server's current one) go with it.

export const FORMAT = "llama-srb-tree";
export const VERSION = 3;

// Every field of a node but its id: what is compared, merged and saved field by field.
export const NODE_FIELDS = [
  "parent", "via", "via_node", "text", "model_chars", "retry_of", "bookmarked", "choices",
  "params", "context", "stats", "created",
];

export function createTree({ name = "", settings = {}, model = null } = {}) {
  return {
    nodes: new Map(), current: null, nextId: 1, context: emptyContext(), name, settings, model,
  };
}

/** A story's name when the writer gave none: the first words of its first text. */
export function nameFrom(text) {
  const words = text.split(/\s+/).filter(Boolean);
  if (!words.length) return "";
  return words.slice(0, 6).join(" ") + (words.length > 6 ? "…" : "");
}

/** Memory and author's note, placed into every prompt (prompt.js). */
export function emptyContext() {
  return { memory: "", note: "", depth: 3 };
}

export function addNode(
  tree, { parent = null, via = null, viaNode = null, text, modelChars = 0, retryOf = null },
) {
  const node = {
    id: tree.nextId++,
    parent,
    via,
    via_node: viaNode,
    text,
    model_chars: modelChars,
    retry_of: retryOf,
    bookmarked: false,
    choices: [],
    params: null,
    context: null,
    stats: null,
    created: new Date().toISOString(),
  };
  tree.nodes.set(node.id, node);
  return node;
}

export function currentNode(tree) {
  return tree.nodes.get(tree.current) ?? null;
}

/** Children of `id` (null: the roots), oldest first. */
export function childrenOf(tree, id) {
  return [...tree.nodes.values()].filter((n) => n.parent === id);
}

/** Every node's children at once (parent id or null → nodes), for drawing the tree. */
export function childIndex(tree) {
  const index = new Map();
  for (const node of tree.nodes.values()) {
    if (!index.has(node.parent)) index.set(node.parent, []);
    index.get(node.parent).push(node);
  }
  return index;
}

export function siblingsOf(tree, id) {
  const node = tree.nodes.get(id);
  return node ? childrenOf(tree, node.parent) : [];
}

/** Ids from the root down to `id`: the path the writer took. `limit` stops a walk round a
 * cycle (only an imported file can have one; the result is then longer than the tree). */
export function pathTo(tree, id, limit = Infinity) {
  const path = [];
  let node = tree.nodes.get(id);
  while (node && path.length <= limit) {
    path.unshift(node.id);
    node = tree.nodes.get(node.parent);
  }
  return path;
}

/** A node that nothing was generated from or branched off yet: safe to change in place. */
export function isUnused(tree, node) {
  return node.choices.length === 0 && childrenOf(tree, node.id).length === 0;
}

/** Where `after` differs from `before`: the lengths of their common start and end. */
export function change(before, after) {
  const most = Math.min(before.length, after.length);
  let prefix = 0;
  while (prefix < most && before[prefix] === after[prefix]) prefix++;
  let suffix = 0;
  while (
    suffix < most - prefix &&
    before[before.length - 1 - suffix] === after[after.length - 1 - suffix]
  ) {
    suffix++;
  }
  return { prefix, suffix };
}

/** The text this node put in place of its parent's (what the tree shows as its label). */
export function addedText(tree, node) {
  const parent = tree.nodes.get(node.parent);
  if (!parent) return node.text;
  const { prefix, suffix } = change(parent.text, node.text);
  return node.text.slice(prefix, node.text.length - suffix);
}

/** Who wrote each part of a node's text: runs `{start, end, who}` with who "writer" or
 * "model", in order, covering the whole text. */
export function authorship(tree, id) {
  let runs = [];
  let text = "";
  for (const nodeId of pathTo(tree, id, tree.nodes.size)) {
    const node = tree.nodes.get(nodeId);
    runs = carryRuns(runs, text, node.text, node.model_chars ?? 0);
    text = node.text;
  }
  return runs;
}

/** The runs of `after`, given those of `before`: the unchanged start and end keep their
 * authors; of the new middle, the first `modelChars` are the model's, the rest the writer's. */
export function carryRuns(runs, before, after, modelChars = 0) {
  const { prefix, suffix } = change(before, after);
  const middleEnd = after.length - suffix;
  const shift = after.length - before.length;
  const out = [];
  const push = (start, end, who) => {
    if (end <= start) return;
    const last = out[out.length - 1];
    if (last && last.who === who && last.end === start) last.end = end;
    else out.push({ start, end, who });
  };
  for (const r of runs) push(r.start, Math.min(r.end, prefix), r.who);
  push(prefix, Math.min(prefix + modelChars, middleEnd), "model");
  push(prefix + modelChars, middleEnd, "writer");
  const tail = before.length - suffix;
  for (const r of runs) push(Math.max(r.start, tail) + shift, r.end + shift, r.who);
  return out;
}

/** Removes `id` and everything below it; returns how many nodes went. */
export function deleteSubtree(tree, id) {
  const doomed = new Set([id]);
  let grew = true;
  while (grew) {
    grew = false;
    for (const node of tree.nodes.values()) {
      if (!doomed.has(node.id) && doomed.has(node.parent)) {
        doomed.add(node.id);
        grew = true;
      }
    }
  }
  const parent = tree.nodes.get(id)?.parent ?? null;
  for (const gone of doomed) tree.nodes.delete(gone);
  if (doomed.has(tree.current)) tree.current = parent;
  return doomed.size;
}

/** Removes the other branches beside `id` (its siblings and what grew from them), except
 * bookmarked ones; returns how many nodes went. Beside a story's first node, only its
 * retries count: the other first nodes are other stories. */
export function pruneSiblings(tree, id) {
  const node = tree.nodes.get(id);
  let removed = 0;
  for (const sibling of siblingsOf(tree, id)) {
    const other = sibling.parent === null && sibling.text !== node.text;
    if (sibling.id !== id && !sibling.bookmarked && !other) {
      removed += deleteSubtree(tree, sibling.id);
    }
  }
  return removed;
}

/** Adds every node of `other` to `tree` under new ids; returns `other`'s current node's new id. */
export function merge(tree, other) {
  const offset = tree.nextId - Math.min(...other.nodes.keys());
  for (const node of other.nodes.values()) {
    const copy = { ...node, id: node.id + offset };
    if (copy.parent !== null) copy.parent += offset;
    if (copy.retry_of !== null) copy.retry_of += offset;
    if (copy.via_node != null) copy.via_node += offset;
    tree.nodes.set(copy.id, copy);
  }
  tree.nextId = Math.max(...tree.nodes.keys()) + 1;
  return other.current === null ? null : other.current + offset;
}

/** A copy to change freely: nodes and choices are copied, texts and the words of finished
 * continuations shared (they are never changed in place). */
export function clone(tree) {
  const copy = { ...tree, context: { ...tree.context }, nodes: new Map() };
  for (const [id, node] of tree.nodes) copy.nodes.set(id, cloneNode(node));
  return copy;
}

/** Makes `nextId` free: past every node, and at least `atLeast` (the server's next id). */
export function bumpNextId(tree, atLeast = 0) {
  tree.nextId = Math.max(freeId(tree), atLeast);
}

/** The first id past `nextId` and every node's. */
export function freeId(tree) {
  let next = Math.max(tree.nextId, 1);
  for (const id of tree.nodes.keys()) if (id >= next) next = id + 1;
  return next;
}

export function cloneNode(node) {
  return { ...node, choices: node.choices.map((c) => ({ ...c })) };
}

/** Whether two JSON values are the same (objects by their keys, in any order). */
export function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) return a.length === b.length && a.every((x, i) => equal(x, b[i]));
  const keys = Object.keys(a).filter((k) => a[k] !== undefined);
  const other = Object.keys(b).filter((k) => b[k] !== undefined);
  return keys.length === other.length && keys.every((k) => equal(a[k], b[k]));
}

export function sameNode(a, b) {
  return a.id === b.id && NODE_FIELDS.every((f) => equal(a[f], b[f]));
}

/** Gives nodes new ids (`moves`: old → new), and every reference to them. A node sitting on
 * a new id that does not move itself moves first, to a free id; returns every move made. */
export function renumber(tree, moves) {
  const all = new Map(moves);
  const targets = new Set(moves.values());
  let free = Math.max(freeId(tree), ...[...targets].map((t) => t + 1));
  for (const target of targets) {
    if (tree.nodes.has(target) && !all.has(target)) all.set(target, free++);
  }
  const to = (id) => (all.has(id) ? all.get(id) : id);
  const nodes = [...tree.nodes.values()];
  for (const node of nodes) {
    node.id = to(node.id);
    if (node.parent !== null) node.parent = to(node.parent);
    if (node.retry_of !== null) node.retry_of = to(node.retry_of);
    if (node.via_node != null) node.via_node = to(node.via_node);
  }
  tree.nodes = new Map(nodes.map((n) => [n.id, n]));
  if (tree.current !== null) tree.current = to(tree.current);
  bumpNextId(tree, free);
  return all;
}

/** The whole story as a file: its nodes, memory and note, settings and name; `model`: the
 * one it is written with (its pick, else the server's). */
export function toJSON(tree, model) {
  return {
    format: FORMAT,
    version: VERSION,
    model: tree.model || model,
    exported: new Date().toISOString(),
    name: tree.name,
    current: tree.current,
    context: tree.context,
    settings: tree.settings,
    nodes: [...tree.nodes.values()],
  };
}

/** Parses an exported tree, throwing an Error that says what is wrong with it. With
 * `allowNoCurrent` (the browser's own copy), no current node means "a new story". */
export function fromJSON(data, { allowNoCurrent = false } = {}) {
  if (!data || data.format !== FORMAT) throw new Error(`not a ${FORMAT} file`);
  const tree = createTree();
  if (allowNoCurrent && Array.isArray(data.nodes) && data.nodes.length === 0) {
    tree.context = { ...emptyContext(), ...checkContext(data.context) };
    readStory(tree, data);
    return tree;
  }
  if (!Array.isArray(data.nodes) || data.nodes.length === 0) throw new Error("no nodes");
  for (const raw of data.nodes) tree.nodes.set(raw.id, checkNode(raw));
  for (const node of tree.nodes.values()) {
    if (node.parent !== null && !tree.nodes.has(node.parent)) {
      throw new Error(`node ${node.id} has a missing parent ${node.parent}`);
    }
    if (pathTo(tree, node.id, tree.nodes.size).length > tree.nodes.size) {
      throw new Error(`node ${node.id} is its own ancestor`);
    }
    if (node.retry_of !== null && !tree.nodes.has(node.retry_of)) node.retry_of = null;
  }
  tree.nextId = Math.max(...tree.nodes.keys()) + 1;
  tree.context = { ...emptyContext(), ...checkContext(data.context) };
  readStory(tree, data);
  for (const node of tree.nodes.values()) {
    // Version 1 said nothing: the whole text a continuation added was the model's.
    if (node.model_chars === Infinity) node.model_chars = addedText(tree, node).length;
  }
  if (tree.nodes.has(data.current)) tree.current = data.current;
  else if (allowNoCurrent && data.current === null) tree.current = null;
  else tree.current = childrenOf(tree, null)[0]?.id ?? null;
  if (tree.current === null && !allowNoCurrent) throw new Error("the tree has no root");
  return tree;
}

/** The story's name and settings (version 3); older files have neither. */
function readStory(tree, data) {
  if (typeof data.name === "string") tree.name = data.name;
  if (data.settings && typeof data.settings === "object" && !Array.isArray(data.settings)) {
    tree.settings = { ...data.settings };
  }
  if (Number.isInteger(data.next_id)) tree.nextId = Math.max(tree.nextId, data.next_id);
}

/** A node as stored or sent, checked (throws an Error that says what is wrong). */
export function readNode(raw) {
  return checkNode(raw);
}

function checkNode(raw) {
  if (!Number.isInteger(raw?.id) || typeof raw.text !== "string" || !Array.isArray(raw.choices)) {
    throw new Error("each node needs an integer id, a text and a list of choices");
  }
  const via = Number.isInteger(raw.via) ? raw.via : null;
  const parent = Number.isInteger(raw.parent) ? raw.parent : null;
  return {
    id: raw.id,
    parent,
    via,
    via_node: Number.isInteger(raw.via_node) ? raw.via_node : null,
    text: raw.text,
    // Version 1 did not say; an accepted continuation was the model's text.
    model_chars: Number.isInteger(raw.model_chars) ? raw.model_chars : via === null ? 0 : Infinity,
    retry_of: Number.isInteger(raw.retry_of) ? raw.retry_of : null,
    bookmarked: Boolean(raw.bookmarked),
    choices: raw.choices.map(checkChoice),
    params: raw.params ?? null,
    context: raw.context ? checkContext(raw.context) : null,
    stats: raw.stats ?? null,
    created: raw.created ?? null,
  };
}

function checkChoice(c) {
  const choice = {
    text: String(c?.text ?? ""),
    finish_reason: c?.finish_reason ?? null,
    tokens: Number(c?.tokens) || 0,
    edited: Boolean(c?.edited),
  };
  if (typeof c?.original === "string") choice.original = c.original;
  if (Array.isArray(c?.pieces)) {
    choice.pieces = c.pieces
      .filter((p) => typeof p?.t === "string")
      .map((p) => ({
        t: p.t,
        lp: typeof p.lp === "number" ? p.lp : null,
        top: Array.isArray(p.top) ? p.top.filter((a) => typeof a?.[0] === "string") : [],
      }));
  }
  return choice;
}

function checkContext(raw) {
  if (!raw || typeof raw !== "object") return {};
  const depth = Number(raw.depth);
  return {
    memory: String(raw.memory ?? ""),
    note: String(raw.note ?? ""),
    depth: Number.isInteger(depth) && depth >= 1 ? depth : 3,
  };
}

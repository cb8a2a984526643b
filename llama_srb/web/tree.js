// The story tree: pure data, no DOM. Every generation is a node holding the story text it
// continued and its n continuations; a child node starts from its parent's text plus the
// continuation the writer accepted (`via`), or from an edited / regenerated story (`via`
// null). Kept flat (id → node) so it serializes to JSON as it is.

export const FORMAT = "llama-srb-tree";
export const VERSION = 1;

export function createTree() {
  return { nodes: new Map(), current: null, nextId: 1 };
}

export function addNode(tree, { parent = null, via = null, text }) {
  const node = {
    id: tree.nextId++,
    parent,
    via,
    text,
    choices: [],
    params: null,
    stats: null,
    created: new Date().toISOString(),
  };
  tree.nodes.set(node.id, node);
  tree.current = node.id;
  return node;
}

export function currentNode(tree) {
  return tree.nodes.get(tree.current) ?? null;
}

export function childrenOf(tree, id) {
  return [...tree.nodes.values()].filter((n) => n.parent === id);
}

export function roots(tree) {
  return childrenOf(tree, null);
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

/** The text this node added to its parent's story (what the tree shows as its label). */
export function addedText(tree, node) {
  const parent = tree.nodes.get(node.parent);
  if (parent && node.text.startsWith(parent.text)) return node.text.slice(parent.text.length);
  return node.text;
}

export function toJSON(tree, model) {
  return {
    format: FORMAT,
    version: VERSION,
    model,
    exported: new Date().toISOString(),
    current: tree.current,
    nodes: [...tree.nodes.values()],
  };
}

/** Parses an exported tree, throwing an Error that says what is wrong with it. */
export function fromJSON(data) {
  if (!data || data.format !== FORMAT) throw new Error(`not a ${FORMAT} file`);
  if (!Array.isArray(data.nodes) || data.nodes.length === 0) throw new Error("no nodes");
  const tree = createTree();
  for (const raw of data.nodes) tree.nodes.set(raw.id, checkNode(raw));
  for (const node of tree.nodes.values()) {
    if (node.parent !== null && !tree.nodes.has(node.parent)) {
      throw new Error(`node ${node.id} has a missing parent ${node.parent}`);
    }
    if (pathTo(tree, node.id, tree.nodes.size).length > tree.nodes.size) {
      throw new Error(`node ${node.id} is its own ancestor`);
    }
  }
  tree.nextId = Math.max(...tree.nodes.keys()) + 1;
  tree.current = tree.nodes.has(data.current) ? data.current : roots(tree)[0]?.id ?? null;
  if (tree.current === null) throw new Error("the tree has no root");
  return tree;
}

function checkNode(raw) {
  if (!Number.isInteger(raw?.id) || typeof raw.text !== "string" || !Array.isArray(raw.choices)) {
    throw new Error("each node needs an integer id, a text and a list of choices");
  }
  return {
    id: raw.id,
    parent: Number.isInteger(raw.parent) ? raw.parent : null,
    via: Number.isInteger(raw.via) ? raw.via : null,
    text: raw.text,
    choices: raw.choices.map((c) => ({
      text: String(c?.text ?? ""),
      finish_reason: c?.finish_reason ?? null,
      tokens: Number(c?.tokens) || 0,
      edited: Boolean(c?.edited),
    })),
    params: raw.params ?? null,
    stats: raw.stats ?? null,
    created: raw.created ?? null,
  };
}

// The story tree as the writer sees it: one row per node, indented only where the story
// forks (a straight run of "Use this" stays in one column, each branch of a fork is a
// group), the path to the current node marked and the current node kept in view. Labels
// say what a node changed (a cut, a replacement, the words it added) and, among siblings,
// start where they differ. Branches fold away (▸, or the key c), a search keeps only the
// nodes that match (and the way to them), and the whole tree is one Tab stop: the current
// row, with the arrow keys inside (keys.js) as in Loom.

import { $, el, keepInView, snippet } from "./dom.js";
import * as Tree from "./tree.js";

const MAX_DEPTH = 8; // deeper forks stop indenting, so labels keep their width
const SHARED_MIN = 12; // siblings' labels skip a common start longer than this,
const SHARED_CONTEXT = 20; // keeping about this much of it before where they differ

let folded = new Set(); // node ids whose descendants are hidden
let foldKey = null; // where `folded` is kept (per story)
let query = "";

/** The story whose folds are shown (they are kept in this browser, per story). */
export function setStory(id) {
  foldKey = id ? `llama-srb.folded.${id}` : null;
  try {
    folded = new Set(JSON.parse(localStorage.getItem(foldKey) ?? "[]"));
  } catch {
    folded = new Set();
  }
}

function keepFolds() {
  if (foldKey) localStorage.setItem(foldKey, JSON.stringify([...folded]));
}

export function setQuery(text) {
  query = text.trim().toLowerCase();
}

/** Folds or unfolds what grows from `id`; false if nothing does. */
export function toggle(tree, id) {
  if (!Tree.childrenOf(tree, id).length) return false;
  if (!folded.delete(id)) folded.add(id);
  keepFolds();
  return true;
}

/** Folds every branch off the path to the current node (the path stays open). */
export function foldOthers(tree) {
  const path = new Set(Tree.pathTo(tree, tree.current));
  const kids = Tree.childIndex(tree);
  folded = new Set();
  for (const [parent, children] of kids) {
    if (children.length < 2) continue;
    for (const child of children) {
      if (!path.has(child.id) && kids.has(child.id)) folded.add(child.id);
    }
    if (parent !== null && !path.has(parent)) folded.add(parent);
  }
  for (const id of path) folded.delete(id);
  keepFolds();
}

/** Draws the tree; `open(id)` is called when the writer picks a node. Returns how many
 * nodes match the search (null without one). */
export function render(tree, open) {
  const nav = $("tree");
  const hadFocus = nav.contains(document.activeElement);
  const path = Tree.pathTo(tree, tree.current);
  const onPath = new Set(path);
  for (const id of path.slice(0, -1)) folded.delete(id); // the current node is never hidden
  const kids = Tree.childIndex(tree);
  const sizes = subtreeSizes(tree, kids);
  const found = query ? matches(tree) : null;
  const shown = found ? withAncestors(tree, found) : null;
  const visible = (node) => !shown || shown.has(node.id);
  // What each node added, once per drawing (a label compares it with its siblings').
  const addedOf = new Map();
  const added = (node) => {
    if (!addedOf.has(node.id)) addedOf.set(node.id, Tree.addedText(tree, node));
    return addedOf.get(node.id);
  };
  const row = (node) =>
    nodeButton(tree, node, { onPath, found, open, siblings: kids.get(node.parent) ?? [], sizes, added });
  // A chain of only children is one list; each child of a fork starts a group of its own,
  // one step in, with a line down its side.
  const chain = (start, depth) => {
    const list = el("ul", { role: "group" });
    let node = start;
    for (;;) {
      list.append(el("li", { role: "none", class: "row" }, [row(node)]));
      const children = (kids.get(node.id) ?? []).filter(visible);
      if (folded.has(node.id) && !shown) return list;
      if (children.length !== 1) {
        for (const child of children) list.append(el("li", { role: "none" }, [group(child, depth + 1)]));
        return list;
      }
      node = children[0];
    }
  };
  const group = (start, depth) => {
    const list = chain(start, depth);
    list.className = depth > MAX_DEPTH ? "branch-group flat" : "branch-group";
    if (onPath.has(start.id)) list.classList.add("on-path");
    return list;
  };
  const roots = (kids.get(null) ?? []).filter(visible);
  const top = el("ul", { role: "tree", "aria-label": "story tree" }, roots.map((r) =>
    el("li", { role: "none" }, [roots.length > 1 ? group(r, 0) : chain(r, 0)]),
  ));
  const empty = found ? "No node matches." : "Nothing generated yet.";
  nav.replaceChildren(roots.length ? top : el("p", { class: "empty", text: empty }));
  // One Tab stop: the current row (else the first).
  const stop = nav.querySelector('[aria-current="true"]') ?? nav.querySelector(".node");
  if (stop) {
    stop.tabIndex = 0;
    keepInView(nav, stop);
    if (hadFocus) stop.focus({ preventScroll: true });
  }
  return found ? found.size : null;
}

function nodeButton(tree, node, { onPath, found, open, siblings, sizes, added }) {
  const hidden = folded.has(node.id) && !found ? sizes.get(node.id) - 1 : 0;
  const button = el("button", {
    type: "button",
    class: "node",
    role: "treeitem",
    tabindex: "-1",
    "data-testid": "tree-node",
    "data-node-id": String(node.id),
    "data-on-path": String(onPath.has(node.id)),
    "data-kind": kindOf(node),
    "data-match": found ? String(found.has(node.id)) : null,
    "aria-expanded": sizes.get(node.id) > 1 ? String(!hidden) : null,
    title: `#${node.id} · ${describe(node)}\n${added(node).slice(0, 600)}`,
  }, [
    el("span", { class: "node-mark", "aria-hidden": "true", text: markOf(node) }),
    el("span", { class: "node-label", text: label(tree, node, siblings, added) }),
    node.bookmarked ? el("span", { class: "node-star", title: "bookmarked", text: "★" }) : "",
    hidden ? el("span", { class: "node-folded", "data-testid": "folded", text: `+${hidden}` }) : "",
    el("span", { class: "node-count", text: node.choices.length ? `${node.choices.length}×` : "" }),
  ]);
  if (node.id === tree.current) button.setAttribute("aria-current", "true");
  button.addEventListener("click", (event) => {
    // A click on the fold count unfolds; anywhere else opens the node.
    if (event.target.closest(".node-folded")) {
      toggle(tree, node.id);
      open(node.id, { refold: true });
    } else {
      open(node.id);
    }
  });
  return button;
}

/** Every node's count of nodes in its subtree (itself included). */
function subtreeSizes(tree, kids) {
  const sizes = new Map();
  const order = [];
  const stack = [...(kids.get(null) ?? [])];
  while (stack.length) {
    const node = stack.pop();
    order.push(node);
    stack.push(...(kids.get(node.id) ?? []));
  }
  for (const node of order.reverse()) {
    const below = (kids.get(node.id) ?? []).reduce((sum, c) => sum + sizes.get(c.id), 0);
    sizes.set(node.id, 1 + below);
  }
  return sizes;
}

/** The nodes whose own text (what they added) or continuations hold the search. */
function matches(tree) {
  const found = new Set();
  for (const node of tree.nodes.values()) {
    const own = node.parent === null ? node.text : Tree.addedText(tree, node);
    if (own.toLowerCase().includes(query) || node.choices.some((c) => c.text.toLowerCase().includes(query))) {
      found.add(node.id);
    }
  }
  return found;
}

function withAncestors(tree, ids) {
  const shown = new Set();
  for (const id of ids) for (const step of Tree.pathTo(tree, id, tree.nodes.size)) shown.add(step);
  return shown;
}

/** The matches in tree order, for Enter in the search box. */
export function found(tree) {
  if (!query) return [];
  const ids = matches(tree);
  return [...tree.nodes.keys()].filter((id) => ids.has(id));
}

function kindOf(node) {
  if (node.retry_of !== null) return "retry";
  if (node.parent === null) return "root";
  return node.via === null ? "writer" : "model";
}

const MARKS = { root: "¶", writer: "✎", model: "↳", retry: "↻" };

function markOf(node) {
  return MARKS[kindOf(node)];
}

/** What the writer did to make this node, in words. */
export function describe(node) {
  const kind = kindOf(node);
  if (kind === "root") return "the start of a story";
  if (kind === "retry") return `a retry of #${node.retry_of}`;
  if (kind === "writer") return "your own text";
  if (node.via_node != null && node.via_node !== node.parent) {
    return `continuation ${node.via + 1} of #${node.via_node}, after your edit`;
  }
  return `continuation ${node.via + 1} of #${node.parent}`;
}

/** What the node changed, in a line: a cut, a replacement, or the words it added (from
 * where they differ from its siblings'). A retry shows what it brought: its first card. */
export function label(tree, node, siblings = [], added = (n) => Tree.addedText(tree, n)) {
  if (node.parent === null && node.retry_of === null) return snippet(node.text, 60) || "(empty)";
  if (node.retry_of !== null) {
    const first = node.choices.find((c) => c.text)?.text;
    return first ? `again: ${snippet(first, 52)}` : "again (nothing yet)";
  }
  const parent = tree.nodes.get(node.parent);
  const { prefix, suffix } = Tree.change(parent.text, node.text);
  const removed = parent.text.slice(prefix, parent.text.length - suffix);
  const put = node.text.slice(prefix, node.text.length - suffix);
  if (!put && removed) return `cut “${snippet(removed, 48)}”`;
  if (!put) return "(no change)";
  if (removed) return `“${snippet(removed, 22)}” → “${snippet(put, 30)}”`;
  const shared = Math.max(0, ...siblings.filter((s) => s !== node && s.retry_of === null)
    .map((s) => commonStart(put, added(s))));
  if (shared > SHARED_MIN) {
    // From a few words before the first that differs.
    const from = put.lastIndexOf(" ", Math.max(0, shared - SHARED_CONTEXT)) + 1;
    return `…${snippet(put.slice(from), 58)}`;
  }
  return snippet(put, 60);
}

function commonStart(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

/** The node that key `key` moves to from the current one, or null. ←/h: parent, →/l: the
 * child last visited (else the first), ↓/j and ↑/k: next and previous sibling. */
export function target(tree, key, lastVisited) {
  const node = Tree.currentNode(tree);
  if (!node) return null;
  const siblings = Tree.siblingsOf(tree, node.id);
  const at = siblings.findIndex((s) => s.id === node.id);
  switch (key) {
    case "ArrowLeft":
    case "h":
      return node.parent;
    case "ArrowRight":
    case "l": {
      const children = Tree.childrenOf(tree, node.id);
      const back = children.find((c) => c.id === lastVisited.get(node.id));
      return (back ?? children[0])?.id ?? null;
    }
    case "ArrowDown":
    case "j":
      return siblings[at + 1]?.id ?? null;
    case "ArrowUp":
    case "k":
      return siblings[at - 1]?.id ?? null;
    default:
      return null;
  }
}

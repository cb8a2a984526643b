// The story tree as the writer sees it: one row per node, indented only where the story
// forks (a straight run of "Use this" stays in one column, each branch of a fork is a
// group), the path to the current node marked and the current node kept in view. Keys move
// along the tree as in Loom.

import { $, el, keepInView, snippet } from "./dom.js";
import * as Tree from "./tree.js";

const MAX_DEPTH = 8; // deeper forks stop indenting, so labels keep their width

/** Draws the tree; `open(id)` is called when the writer picks a node. */
export function render(tree, open) {
  const nav = $("tree");
  const hadFocus = nav.contains(document.activeElement);
  const path = new Set(Tree.pathTo(tree, tree.current));
  const kids = Tree.childIndex(tree);
  // A chain of only children is one list; each child of a fork starts a group of its own,
  // one step in, with a line down its side.
  const chain = (start, depth) => {
    const list = el("ul", { role: "list" });
    let node = start;
    for (;;) {
      list.append(el("li", {}, [nodeButton(tree, node, path, open)]));
      const children = kids.get(node.id) ?? [];
      if (children.length !== 1) {
        for (const child of children) list.append(el("li", {}, [group(child, depth + 1)]));
        return list;
      }
      node = children[0];
    }
  };
  const group = (start, depth) => {
    const list = chain(start, depth);
    list.className = depth > MAX_DEPTH ? "branch-group flat" : "branch-group";
    if (path.has(start.id)) list.classList.add("on-path");
    return list;
  };
  const roots = kids.get(null) ?? [];
  const top = el("ul", { role: "list" }, roots.map((r) => el("li", {}, [
    roots.length > 1 ? group(r, 0) : chain(r, 0),
  ])));
  nav.replaceChildren(roots.length ? top : el("p", { class: "empty", text: "Nothing generated yet." }));
  const current = nav.querySelector('[aria-current="true"]');
  if (current) {
    keepInView(nav, current);
    if (hadFocus) current.focus({ preventScroll: true });
  }
}

function nodeButton(tree, node, path, open) {
  const button = el("button", {
    type: "button",
    class: "node",
    "data-testid": "tree-node",
    "data-node-id": String(node.id),
    "data-on-path": String(path.has(node.id)),
    "data-kind": kindOf(node),
    title: `#${node.id} · ${describe(node)}\n${Tree.addedText(tree, node).slice(0, 600)}`,
  }, [
    el("span", { class: "node-mark", "aria-hidden": "true", text: markOf(node) }),
    el("span", { class: "node-label", text: label(tree, node) }),
    node.bookmarked ? el("span", { class: "node-star", title: "bookmarked", text: "★" }) : "",
    el("span", { class: "node-count", text: node.choices.length ? `${node.choices.length}×` : "" }),
  ]);
  if (node.id === tree.current) button.setAttribute("aria-current", "true");
  button.addEventListener("click", () => open(node.id));
  return button;
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
  return `continuation ${node.via + 1} of #${node.parent}`;
}

function label(tree, node) {
  const added = Tree.addedText(tree, node);
  if (node.parent === null) return snippet(node.text, 60) || "(empty)";
  return snippet(added, 60) || "(no new text)";
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

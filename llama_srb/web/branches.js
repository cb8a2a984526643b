// The branches already taken from the current node, side by side and in full, each with
// where the story went from there (down the path last visited), to compare them.

import { $, el } from "./dom.js";
import * as Tree from "./tree.js";
import { describe } from "./treeview.js";

export function render(tree, node, lastVisited, open) {
  const children = node ? Tree.childrenOf(tree, node.id) : [];
  $("branches").hidden = children.length === 0;
  $("branch-list").replaceChildren(
    ...children.map((child) => column(tree, child, lastVisited, open)),
  );
}

/** The end of the path down from `node`: the child last visited at each step, else the newest. */
function pathEnd(tree, node, lastVisited) {
  let end = node;
  let steps = 0;
  for (;;) {
    const children = Tree.childrenOf(tree, end.id);
    if (children.length === 0 || steps > tree.nodes.size) return { end, steps };
    end = children.find((c) => c.id === lastVisited.get(end.id)) ?? children[children.length - 1];
    steps++;
  }
}

function column(tree, child, lastVisited, open) {
  const added = Tree.addedText(tree, child);
  const modelChars = Math.min(child.model_chars ?? 0, added.length);
  const button = el("button", { type: "button", "data-testid": "open-branch" }, ["Open"]);
  button.addEventListener("click", () => open(child.id));
  return el("article", {
    class: "branch", "data-testid": "branch", "data-node-id": String(child.id),
  }, [
    el("header", { class: "choice-head" }, [
      el("span", { class: "choice-index", text: `#${child.id}` }),
      el("span", { text: describe(child) }),
      child.bookmarked ? el("span", { class: "node-star", text: "★" }) : "",
    ]),
    el("div", { class: "branch-text", "data-testid": "branch-text" }, [
      modelChars ? el("mark", { class: "by-model" }, [added.slice(0, modelChars)]) : "",
      added.slice(modelChars) || (modelChars ? "" : "(the same text)"),
    ]),
    onwards(tree, child, lastVisited),
    el("footer", { class: "choice-foot" }, [button]),
  ]);
}

function onwards(tree, child, lastVisited) {
  const { end, steps } = pathEnd(tree, child, lastVisited);
  if (steps === 0) return "";
  const { prefix, suffix } = Tree.change(child.text, end.text);
  return el("div", { class: "branch-onwards", "data-testid": "branch-onwards" }, [
    el("p", { class: "wm-label", text: `then, ${steps} step(s) on (#${end.id}):` }),
    end.text.slice(prefix, end.text.length - suffix),
  ]);
}

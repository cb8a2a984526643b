// The tree kept in the browser's local storage, so a reload or a closed tab loses nothing.

import * as Tree from "./tree.js";

const TREE_KEY = "llama-srb.tree";

export function loadTree() {
  try {
    const saved = localStorage.getItem(TREE_KEY);
    if (saved) return Tree.fromJSON(JSON.parse(saved), { allowNoCurrent: true });
  } catch {
    // an unreadable saved tree is dropped rather than breaking the page
  }
  return Tree.createTree();
}

/** Saves the tree; returns false when even a slimmed copy does not fit. */
export function saveTree(tree, model) {
  const data = Tree.toJSON(tree, model);
  try {
    localStorage.setItem(TREE_KEY, JSON.stringify(data));
    return true;
  } catch {
    // Full: keep the words' alternatives of the shown node only.
    data.nodes = data.nodes.map((n) =>
      n.id === tree.current ? n : { ...n, choices: n.choices.map(withoutPieces) },
    );
    try {
      localStorage.setItem(TREE_KEY, JSON.stringify(data));
      return true;
    } catch {
      return false;
    }
  }
}

function withoutPieces({ pieces, ...choice }) {
  return choice;
}

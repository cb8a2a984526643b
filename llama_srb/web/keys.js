// The keyboard. Anywhere: Ctrl+Enter generates (inside a card: uses that card), Esc stops
// (or closes the word menu), Alt+R retries. Outside text boxes: Ctrl+Z undoes, Ctrl+Shift+Z
// or Ctrl+Y redoes. In the tree: arrows (or h j k l) move, c folds or unfolds what grows
// from the node, b bookmarks, Delete deletes.

import { isTyping } from "./dom.js";

const MOVES = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "h", "j", "k", "l"];

/** `a`: the actions, {useCard(target) → bool, generate, escape() → bool, retry, undo, redo,
 * move(key), fold, bookmark, remove}. */
export function bind(a) {
  document.addEventListener("keydown", (event) => {
    const mod = event.ctrlKey || event.metaKey;
    const handled = (fn) => {
      event.preventDefault();
      fn();
    };
    if (event.key === "Enter" && mod && !event.shiftKey && !event.altKey) {
      handled(() => a.useCard(event.target) || a.generate());
    } else if (event.key === "Escape") {
      if (a.escape()) event.preventDefault();
    } else if (event.altKey && !mod && event.code === "KeyR") {
      handled(a.retry);
    } else if (mod && !event.altKey && !isTyping(event.target)) {
      const key = event.key.toLowerCase();
      if (key === "y" || (key === "z" && event.shiftKey)) handled(a.redo);
      else if (key === "z") handled(a.undo);
    } else if (!mod && !event.altKey && event.target.closest?.("#tree")) {
      if (MOVES.includes(event.key)) handled(() => a.move(event.key));
      else if (event.key === "b") handled(a.bookmark);
      else if (event.key === "c") handled(a.fold);
      else if (event.key === "Delete") handled(a.remove);
    }
  });
}

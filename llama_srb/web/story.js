// The story box: the text of the current node, with the model's words marked apart from
// the writer's (a backdrop of <mark>s behind a transparent textarea), kept scrolled to its
// end, and the writer's unsaved edit (a draft) kept in local storage, per story, until it
// joins the tree.

import { $, el } from "./dom.js";
import { carryRuns } from "./tree.js";

let draftKey = null; // where the open story's draft is kept

/** Where story `id`'s draft is kept. */
export function draftKeyOf(id) {
  return `llama-srb.draft.${id}`;
}

export function setStory(id) {
  draftKey = id ? draftKeyOf(id) : null;
}

/** After the server gave nodes new ids: the shown node and its draft follow. */
export function renumber(moves) {
  if (!moves.has(base.node)) return;
  base.node = moves.get(base.node);
  saveDraft();
}

// What the shown node holds; the box differs from it while the writer has a draft.
let base = { node: null, text: "", runs: [] };

export function init(onInput) {
  const box = $("story");
  let painting = 0;
  box.addEventListener("input", () => {
    saveDraft();
    // Once a frame is enough: a long story's marks are laid out again each time.
    cancelAnimationFrame(painting);
    painting = requestAnimationFrame(paint);
    onInput();
  });
  box.addEventListener("scroll", () => {
    $("story-marks").scrollTop = box.scrollTop;
  });
  new ResizeObserver(() => {
    $("story-marks").scrollTop = box.scrollTop;
  }).observe(box);
}

/** Shows a node's text (or `draft` over it) and scrolls to its end. */
export function show(nodeId, text, runs, draft = null) {
  base = { node: nodeId, text, runs };
  $("story").value = draft ?? text;
  saveDraft();
  paint();
  scrollToEnd();
}

export function value() {
  return $("story").value;
}

/** Whether the box holds text the tree does not have yet. */
export function isDraft() {
  return value() !== base.text && !(base.node === null && value().trim() === "");
}

export function setReadOnly(readOnly) {
  $("story").readOnly = readOnly;
  $("story-box").classList.toggle("readonly", readOnly);
}

/** The newest text in view: the box scrolled to its end. */
function scrollToEnd() {
  const box = $("story");
  box.scrollTop = box.scrollHeight;
  $("story-marks").scrollTop = box.scrollTop;
}

/** The draft saved for `nodeId` (null: a new story), if any. */
export function savedDraft(nodeId) {
  if (!draftKey) return null;
  try {
    const draft = JSON.parse(localStorage.getItem(draftKey) ?? "null");
    if (draft && draft.node === nodeId && typeof draft.text === "string") return draft.text;
  } catch {
    // a corrupt entry is ignored
  }
  return null;
}

function saveDraft() {
  if (!draftKey) return;
  if (isDraft()) {
    localStorage.setItem(draftKey, JSON.stringify({ node: base.node, text: value() }));
  } else {
    localStorage.removeItem(draftKey);
  }
  $("draft-state").hidden = !isDraft() || base.node === null;
}

function paint() {
  const text = value();
  const runs = carryRuns(base.runs, base.text, text, 0);
  const parts = runs.map((r) => {
    const piece = text.slice(r.start, r.end);
    return r.who === "model" ? el("mark", { class: "by-model" }, [piece]) : piece;
  });
  // A final newline needs a character after it to take up its line, as in the textarea.
  $("story-marks").replaceChildren(...parts, " ");
}

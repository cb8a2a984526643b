// Memory and author's note: the form that edits them, and the "what is sent" view of the
// exact prompt the next Generate sends (prompt.js places them).

import { $, el } from "./dom.js";
import { promptParts } from "./prompt.js";

/** `onChange(context)` hears every edit. */
export function init(onChange) {
  $("context").addEventListener("input", () => onChange(read()));
  $("context").addEventListener("submit", (e) => e.preventDefault());
}

export function fill({ memory, note, depth }) {
  $("memory").value = memory;
  $("note").value = note;
  $("note-depth").value = String(depth);
  if (memory.trim() || note.trim()) $("context-panel").open = true;
}

function read() {
  const depth = Number($("note-depth").value);
  return {
    memory: $("memory").value,
    note: $("note").value,
    depth: Number.isInteger(depth) && depth >= 1 ? depth : 3,
  };
}

/** Shows the prompt for `story`, memory and note marked (only while the view is open). */
export function showSent(story, context) {
  if (!$("sent").open) return;
  const parts = promptParts(story, context);
  $("sent-prompt").replaceChildren(
    ...parts.map((p) => (p.kind === "story" ? p.text : el("mark", { class: p.kind }, [p.text]))),
  );
}

// What is sent: the story with the writer's memory at the top and the author's note a few
// lines before the end, where it steers the next words most (as NovelAI and KoboldAI do).
// The continuations are appended to the story only; memory and note never enter it.

/** The prompt for `story` with `context` ({memory, note, depth}) placed into it. */
export function buildPrompt(story, context = {}) {
  return promptParts(story, context)
    .map((p) => p.text)
    .join("");
}

/** The prompt in parts, `{text, kind}` with kind "memory", "note" or "story", in order. */
export function promptParts(story, context = {}) {
  const memory = context.memory ?? "";
  const note = context.note ?? "";
  const parts = [];
  if (memory.trim()) parts.push({ kind: "memory", text: memory.endsWith("\n") ? memory : `${memory}\n` });
  if (!note.trim()) {
    parts.push({ kind: "story", text: story });
    return parts;
  }
  // The note goes on a line of its own, `depth` lines before the end (or first).
  const lines = story.split("\n");
  const at = Math.max(0, lines.length - Math.max(1, Number(context.depth) || 1));
  const before = lines.slice(0, at).join("\n");
  const after = lines.slice(at).join("\n");
  if (at > 0) parts.push({ kind: "story", text: `${before}\n` });
  parts.push({ kind: "note", text: `${note}\n` });
  parts.push({ kind: "story", text: after });
  return parts;
}

/** Whether `context` changes the prompt at all (then a node records it). */
export function hasContext(context) {
  return Boolean(context?.memory?.trim() || context?.note?.trim());
}

// The current node, described: how it was made, the settings and context it was generated
// with, how fast; its bookmark, delete and prune buttons are wired by app.js.

import { $, el, snippet } from "./dom.js";
import { describe } from "./treeview.js";

export function render(node) {
  const has = node !== null;
  for (const id of ["bookmark", "delete-node", "prune", "reuse-settings"]) $(id).disabled = !has;
  $("reuse-settings").disabled = !node?.params;
  $("bookmark").setAttribute("aria-pressed", String(Boolean(node?.bookmarked)));
  $("bookmark").textContent = node?.bookmarked ? "★ Bookmarked" : "☆ Bookmark";
  if (!has) {
    $("node-origin").textContent = "A new story: nothing generated yet.";
    $("node-settings").replaceChildren();
    return;
  }
  const when = node.created ? new Date(node.created).toLocaleString() : "";
  $("node-origin").textContent = `#${node.id}: ${describe(node)}${when ? ` · ${when}` : ""}`;
  $("node-settings").replaceChildren(...settingsList(node));
}

function settingsList(node) {
  const rows = [];
  const add = (name, value) =>
    rows.push(el("div", {}, [el("dt", { text: name }), el("dd", { text: value })]));
  for (const [key, value] of Object.entries(node.params ?? {})) {
    add(key, Array.isArray(value) ? value.map((s) => JSON.stringify(s)).join(" ") : String(value));
  }
  if (node.context?.memory?.trim()) add("memory", snippet(node.context.memory, 80));
  if (node.context?.note?.trim()) {
    add("author's note", `${snippet(node.context.note, 60)} (depth ${node.context.depth})`);
  }
  const s = node.stats;
  if (s) {
    if (s.ttft_ms != null) add("first token", `${s.ttft_ms} ms`);
    if (s.tokens_per_s != null) add("speed", `${s.tokens_per_s.toFixed(1)} tok/s`);
    add("tokens", String(s.completion_tokens));
  }
  if (rows.length === 0) rows.push(el("div", { class: "empty", text: "Not generated from yet." }));
  return rows;
}

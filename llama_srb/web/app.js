// The branching-story UI: wires the page to the tree model (tree.js), the settings
// (settings.js) and the server (api.js). State lives in `state`; the DOM is redrawn from it
// on navigation, and only the streaming cards are patched while tokens arrive.

import { ApiError, fetchModelName, streamCompletion } from "./api.js";
import * as Settings from "./settings.js";
import * as Tree from "./tree.js";

const TREE_KEY = "llama-srb.tree";
const API_KEY_KEY = "llama-srb.api-key";
const DRAFT_KEY = "llama-srb.draft";

const $ = (id) => document.getElementById(id);

const state = {
  tree: loadTree(),
  model: "",
  run: null, // {controller, node} while a generation streams
  cards: [], // the continuation cards of the shown node, by choice index
  lastStats: null, // timing of the last generation, for the top bar
};

init();

function init() {
  buildSettingsForm();
  $("api-key").value = localStorage.getItem(API_KEY_KEY) ?? "";
  const node = Tree.currentNode(state.tree);
  $("story").value = node ? node.text : localStorage.getItem(DRAFT_KEY) ?? "";
  wireEvents();
  render();
  loadModel();
}

function wireEvents() {
  $("generate").addEventListener("click", generate);
  $("stop").addEventListener("click", stop);
  $("export-text").addEventListener("click", exportText);
  $("export-json").addEventListener("click", exportJSON);
  $("import-json").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", importJSON);
  $("new-story").addEventListener("click", newStory);
  $("api-key").addEventListener("change", () => {
    localStorage.setItem(API_KEY_KEY, $("api-key").value.trim());
    loadModel();
  });
  $("story").addEventListener("input", () => {
    // Only a story not yet generated from is a draft; nodes keep their own text.
    if (!Tree.currentNode(state.tree)) localStorage.setItem(DRAFT_KEY, $("story").value);
  });
  document.addEventListener("keydown", onKey);
}

function onKey(event) {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    generate();
  } else if (event.key === "Escape" && state.run) {
    event.preventDefault();
    stop();
  }
}

// ---------- settings ----------

function buildSettingsForm() {
  const saved = { ...Settings.defaults(), ...Settings.loadSaved() };
  const form = $("settings");
  for (const group of Settings.GROUPS) {
    const set = el("fieldset", {}, [el("legend", { text: group.legend })]);
    for (const field of group.fields) set.append(settingField(field, saved[field.key]));
    form.append(set);
  }
  form.addEventListener("input", () => Settings.save(readSettings()));
  form.addEventListener("submit", (e) => e.preventDefault());
}

function settingField(field, value) {
  const attrs = { name: field.key, "data-testid": `setting-${field.key}` };
  const input = field.multiline
    ? el("textarea", { ...attrs, rows: "2", spellcheck: "false" })
    : el("input", { ...attrs, type: "number", inputmode: "decimal", step: field.step });
  if (field.min !== undefined && !field.multiline) input.min = field.min;
  if (field.max !== undefined) input.max = field.max;
  input.value = value ?? "";
  return el("label", { class: field.multiline ? "field wide" : "field" }, [field.label, input]);
}

/** The first setting that is not a number or out of range. A value off the spinner's step
 * (top-p 0.925, say) is fine: `step` only sets how far the arrows move. */
function invalidSetting() {
  return [...$("settings").elements].find(({ validity: v }) =>
    v.badInput || v.rangeUnderflow || v.rangeOverflow,
  );
}

function readSettings() {
  return Object.fromEntries(new FormData($("settings")).entries());
}

// ---------- generating ----------

async function generate() {
  if (state.run) return;
  const text = $("story").value;
  if (!text.trim()) return setStatus("Write the beginning of a story first.", "error");
  const bad = invalidSetting();
  if (bad) {
    bad.focus();
    return setStatus(`${bad.name}: ${bad.validationMessage}`, "error");
  }
  await run(nodeToGenerate(text));
}

/** Generating again from a node that already has continuations makes a new child node,
 * so no earlier generation is ever overwritten; a node that produced no text (never run,
 * failed, stopped at once) is reused instead. */
function nodeToGenerate(text) {
  const current = Tree.currentNode(state.tree);
  const unused = current && !hasChildren(current) && current.choices.every((c) => c.text === "");
  if (unused) {
    current.text = text;
    return current;
  }
  return Tree.addNode(state.tree, { parent: current?.id ?? null, text });
}

function accept(node, index) {
  if (state.run) return;
  const choice = node.choices[index];
  const text = node.text + choice.text;
  const child = Tree.addNode(state.tree, { parent: node.id, via: index, text });
  $("story").value = child.text;
  // The clicked button is about to be redrawn; keep keyboard focus near the new cards.
  $("choices").focus();
  run(child);
}

async function run(node) {
  const fields = Settings.requestFields(readSettings());
  node.params = fields;
  node.choices = Array.from({ length: fields.n ?? 1 }, () => emptyChoice());
  state.run = { controller: new AbortController(), node };
  render();
  setStatus(`Generating ${node.choices.length} continuation(s)…`);
  const timing = { start: performance.now(), first: null, usage: null };
  try {
    await streamCompletion(
      { ...fields, prompt: node.text },
      {
        apiKey: $("api-key").value.trim(),
        signal: state.run.controller.signal,
        onChunk: (chunk) => onChunk(node, chunk, timing),
      },
    );
    finishOpenChoices(node, "incomplete"); // only if the stream ended without finish reasons
    setStatus("");
  } catch (err) {
    const stopped = err.name === "AbortError";
    finishOpenChoices(node, stopped ? "stopped" : "error");
    setStatus(stopped ? "Stopped." : errorText(err), stopped ? "" : "error");
  } finally {
    node.stats = stats(node, timing);
    state.lastStats = node.stats;
    state.run = null;
    saveTree();
    render();
  }
}

function onChunk(node, chunk, timing) {
  if (chunk.usage) timing.usage = chunk.usage;
  for (const delta of chunk.choices ?? []) {
    const choice = node.choices[delta.index];
    if (!choice) continue;
    if (delta.text) {
      timing.first ??= performance.now();
      choice.text += delta.text;
      // One piece per engine step and choice, so pieces ≈ tokens; a piece held back by the
      // detokenizer or a stop-string prefix can carry more than one (then this undercounts).
      choice.tokens += 1;
    }
    if (delta.finish_reason) {
      choice.finish_reason = delta.finish_reason;
      // Reaching max_tokens makes the count exact.
      if (delta.finish_reason === "length") choice.tokens = node.params.max_tokens ?? choice.tokens;
    }
    if (Tree.currentNode(state.tree) === node) updateCard(delta.index, choice);
  }
}

function stop() {
  // Aborting the fetch closes the connection; the server then cancels the request.
  state.run?.controller.abort();
}

function finishOpenChoices(node, reason) {
  for (const choice of node.choices) choice.finish_reason ??= reason;
}

function stats(node, { start, first, usage }) {
  const end = performance.now();
  const tokens = usage?.completion_tokens ?? node.choices.reduce((sum, c) => sum + c.tokens, 0);
  // Generation speed: tokens of all n continuations over the time since the first one arrived.
  const seconds = first === null ? 0 : (end - first) / 1000;
  return {
    ttft_ms: first === null ? null : Math.round(first - start),
    tokens_per_s: seconds > 0 ? tokens / seconds : null,
    completion_tokens: tokens,
    prompt_tokens: usage?.prompt_tokens ?? null,
  };
}

function errorText(err) {
  if (err instanceof ApiError) return `Server: ${err.message}`;
  return `Could not reach the server (${err.message}).`;
}

// ---------- navigation, import and export ----------

function jumpTo(id) {
  stop(); // the running generation keeps what it produced so far
  state.tree.current = id;
  $("story").value = Tree.currentNode(state.tree).text;
  saveTree();
  render();
  $("story").focus();
}

function newStory() {
  stop();
  state.tree.current = null; // the old story stays in the tree; the next Generate starts a root
  $("story").value = "";
  render();
  $("story").focus();
}

function exportText() {
  const node = Tree.currentNode(state.tree);
  const text = node ? node.text : $("story").value;
  download("story.txt", text, "text/plain");
}

function exportJSON() {
  const data = Tree.toJSON(state.tree, state.model);
  download("llama-srb-tree.json", JSON.stringify(data, null, 2), "application/json");
}

async function importJSON(event) {
  const file = event.target.files[0];
  event.target.value = ""; // so choosing the same file again fires `change` again
  if (!file) return;
  try {
    const tree = Tree.fromJSON(JSON.parse(await file.text()));
    stop();
    state.tree = tree;
    $("story").value = Tree.currentNode(tree).text;
    saveTree();
    render();
    setStatus(`Imported ${tree.nodes.size} node(s).`);
  } catch (err) {
    setStatus(`Could not import ${file.name}: ${err.message}`, "error");
  }
}

function download(name, content, type) {
  const url = URL.createObjectURL(new Blob([content], { type }));
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// ---------- rendering ----------

function render() {
  const running = state.run !== null;
  $("generate").disabled = running;
  $("stop").disabled = !running;
  $("story").readOnly = running; // the prompt being continued must match what is shown
  renderChoices();
  renderTree();
  renderStats();
}

function renderChoices() {
  const node = Tree.currentNode(state.tree);
  const box = $("choices");
  box.replaceChildren();
  state.cards = [];
  if (!node || node.choices.length === 0) {
    box.append(el("p", { class: "empty", text: "No continuations yet: press Generate." }));
    return;
  }
  node.choices.forEach((choice, index) => {
    const card = choiceCard(node, index);
    state.cards.push(card);
    box.append(card);
    updateCard(index, choice);
  });
}

function choiceCard(node, index) {
  const card = $("choice-template").content.firstElementChild.cloneNode(true);
  const text = card.querySelector(".choice-text");
  card.dataset.index = String(index);
  card.querySelector(".choice-index").textContent = `#${index + 1}`;
  text.setAttribute("aria-label", `continuation ${index + 1}`);
  text.addEventListener("input", () => {
    node.choices[index].text = text.value;
    node.choices[index].edited = true;
    card.querySelector(".edited").hidden = false;
    saveTreeSoon();
  });
  card.querySelector(".use").addEventListener("click", () => accept(node, index));
  const branches = Tree.childrenOf(state.tree, node.id).filter((c) => c.via === index).length;
  if (branches) card.querySelector(".branches").textContent = `branched ${branches}×`;
  return card;
}

function updateCard(index, choice) {
  const card = state.cards[index];
  if (!card) return;
  const streaming = choice.finish_reason === null && state.run !== null;
  const text = card.querySelector(".choice-text");
  if (text.value !== choice.text) text.value = choice.text;
  text.readOnly = streaming;
  card.dataset.finished = String(choice.finish_reason !== null);
  const finish = card.querySelector(".finish");
  finish.textContent = choice.finish_reason ?? (streaming ? "streaming…" : "–");
  finish.dataset.reason = choice.finish_reason ?? "";
  card.querySelector(".tokens").textContent = `${choice.tokens} tok`;
  card.querySelector(".use").disabled = state.run !== null;
  card.querySelector(".edited").hidden = !choice.edited;
}

function renderTree() {
  const nav = $("tree");
  const path = new Set(Tree.pathTo(state.tree, state.tree.current));
  const roots = Tree.roots(state.tree);
  const empty = el("p", { class: "empty", text: "Nothing generated yet." });
  nav.replaceChildren(roots.length ? treeList(roots, path) : empty);
}

function treeList(nodes, path) {
  return el(
    "ul",
    {},
    nodes.map((node) => {
      const children = Tree.childrenOf(state.tree, node.id);
      const item = el("li", {}, [treeButton(node, path)]);
      if (children.length) item.append(treeList(children, path));
      return item;
    }),
  );
}

function treeButton(node, path) {
  const current = node.id === state.tree.current;
  const button = el("button", {
    type: "button",
    class: "node",
    "data-testid": "tree-node",
    "data-node-id": String(node.id),
    "data-on-path": String(path.has(node.id)),
    title: tail(node.text, 400),
  }, [
    el("span", { class: "node-id", text: `#${node.id}` }),
    el("span", { class: "node-label", text: nodeLabel(node) }),
    el("span", { class: "node-count", text: `${node.choices.length}×` }),
  ]);
  if (current) button.setAttribute("aria-current", "true");
  button.addEventListener("click", () => jumpTo(node.id));
  return button;
}

function nodeLabel(node) {
  if (node.parent === null) return snippet(node.text);
  const parent = state.tree.nodes.get(node.parent);
  if (node.via !== null) return `↳ ${node.via + 1}: ${snippet(Tree.addedText(state.tree, node))}`;
  if (node.text === parent?.text) return "↻ again";
  return `✎ ${snippet(Tree.addedText(state.tree, node))}`;
}

function renderStats() {
  const last = state.lastStats;
  $("stat-ttft").textContent = last?.ttft_ms != null ? `${last.ttft_ms} ms` : "–";
  $("stat-tps").textContent = last?.tokens_per_s != null ? last.tokens_per_s.toFixed(1) : "–";
  $("stat-tokens").textContent = last ? String(last.completion_tokens) : "–";
}

async function loadModel() {
  const label = $("model-name");
  try {
    state.model = await fetchModelName($("api-key").value.trim());
    label.textContent = state.model;
    label.classList.remove("error");
  } catch (err) {
    state.model = "";
    label.textContent = err instanceof ApiError ? err.message : "server unreachable";
    label.classList.add("error");
  }
}

function setStatus(message, kind = "") {
  $("status").textContent = message;
  $("status").dataset.kind = kind;
}

// ---------- small helpers ----------

function hasChildren(node) {
  return Tree.childrenOf(state.tree, node.id).length > 0;
}

function emptyChoice() {
  return { text: "", finish_reason: null, tokens: 0, edited: false };
}

function snippet(text, max = 48) {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat || "(empty)";
}

function tail(text, max) {
  return text.length > max ? `…${text.slice(-max)}` : text;
}

/** A DOM element: `attrs.text` sets its text; other attrs become attributes. */
function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function loadTree() {
  try {
    const saved = localStorage.getItem(TREE_KEY);
    if (saved) return Tree.fromJSON(JSON.parse(saved));
  } catch {
    // an unreadable saved tree is dropped rather than breaking the page
  }
  return Tree.createTree();
}

let saveTimer = null;

// Edits save once typing pauses, not on every keystroke: the whole tree is rewritten.
function saveTreeSoon() {
  clearTimeout(saveTimer);
  saveTimer = setTimeout(saveTree, 400);
}

function saveTree() {
  if (state.tree.nodes.size === 0) return localStorage.removeItem(TREE_KEY);
  try {
    localStorage.setItem(TREE_KEY, JSON.stringify(Tree.toJSON(state.tree, state.model)));
  } catch {
    setStatus("The tree is too big to keep in this browser; export it to keep it.", "error");
  }
}

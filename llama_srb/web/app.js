// The branching-story UI: what the writer does (generate, retry, use a card or part of
// it, go elsewhere in the tree, undo) as changes to the tree (tree.js) and the requests
// they make (run.js), then a redraw. Drawing, keys and storage live in the other modules.

import { ApiError, sessionOf } from "./api.js";
import { ask } from "./ask.js";
import * as Branches from "./branches.js";
import * as Cards from "./cards.js";
import * as Connection from "./connection.js";
import * as Context from "./context.js";
import { $, debounce } from "./dom.js";
import * as Files from "./files.js";
import * as History from "./history.js";
import * as Keys from "./keys.js";
import * as NodeInfo from "./nodeinfo.js";
import { buildPrompt, hasContext } from "./prompt.js";
import * as Run from "./run.js";
import * as Settings from "./settings.js";
import { setNotice, setStatus } from "./status.js";
import * as Storage from "./storage.js";
import * as Story from "./story.js";
import * as Tree from "./tree.js";
import * as TreeView from "./treeview.js";
import * as Words from "./words.js";

const state = {
  tree: Storage.loadTree(),
  model: "",
  run: null, // {controller, plan, from, tree, node, undo} while a generation is on
  history: History.createHistory(),
  lastVisited: new Map(), // node id → the child the writer last came back from, for →
};

function init() {
  Settings.buildForm($("settings"));
  Story.init(onStoryInput);
  showCurrent({ restoreDraft: true });
  Context.init(onContextInput);
  Context.fill(state.tree.context);
  Words.init($("choices"), wordAt);
  new ResizeObserver(() => Cards.balance()).observe($("choices"));
  wireButtons();
  Keys.bind({
    // Inside a card, Ctrl+Enter takes that card, as its "Use this" would.
    useCard: (target) => {
      const index = Cards.indexOf(target);
      if (index !== null) acceptCard(Tree.currentNode(state.tree), index);
      return index !== null;
    },
    generate,
    escape: () => {
      if (Words.isOpen()) Words.hide();
      else if (state.run) stop();
      else return false;
      return true;
    },
    retry,
    undo,
    redo,
    move: (key) => {
      const id = TreeView.target(state.tree, key, state.lastVisited);
      if (id !== null && id !== undefined) jumpTo(id);
    },
    bookmark: toggleBookmark,
    remove: deleteNode,
  });
  // A reload or a closed tab must not lose a pending save; it stops a generation too.
  window.addEventListener("pagehide", () => {
    Run.finishOpen(state.run?.node, "stopped");
    saveTree();
  });
  render();
  Connection.init((name) => {
    state.model = name;
  });
}

function wireButtons() {
  const on = (id, fn) => $(id).addEventListener("click", fn);
  on("generate", generate);
  on("retry", retry);
  on("stop", stop);
  on("undo", undo);
  on("redo", redo);
  on("export-text", () => Files.download("story.txt", Story.value(), "text/plain"));
  on("export-json", exportJSON);
  on("import-json", () => $("import-file").click());
  $("import-file").addEventListener("change", importJSON);
  on("new-story", newStory);
  on("bookmark", toggleBookmark);
  on("delete-node", deleteNode);
  on("prune", prune);
  on("reuse-settings", reuseSettings);
  $("sent").addEventListener("toggle", () => Context.showSent(Story.value(), state.tree.context));
}

// ---------- generating ----------

/** Continues the story as the box shows it: the writer's edit becomes a node of its own;
 * the same text as the node's gives that node (again) new continuations. */
function generate() {
  if (state.run) return;
  const text = Story.value();
  if (!text.trim()) return setStatus("Write the beginning of a story first.", "error");
  const node = Tree.currentNode(state.tree);
  if (node && text === node.text) return start(retryPlan(node));
  if (node && Tree.isUnused(state.tree, node)) return start({ reuse: node, text, draft: true });
  start({ parent: node?.id ?? null, via: null, text, modelChars: 0, draft: true });
}

/** New continuations for the current node's text, beside the old ones (one key: Alt+R). */
function retry() {
  stop();
  const node = Tree.currentNode(state.tree);
  if (!node || Story.isDraft()) return generate();
  start(retryPlan(node));
}

/** A node never generated from gets its continuations itself; otherwise the retry is a
 * sibling with the same text, so earlier continuations are never overwritten. */
function retryPlan(node) {
  const plan = {
    parent: node.parent,
    via: node.via,
    text: node.text,
    modelChars: node.model_chars,
    retryOf: node.retry_of ?? node.id,
  };
  return node.choices.length === 0 ? { ...plan, reuse: node, retryOf: node.retry_of } : plan;
}

function acceptCard(node, index) {
  const choice = node?.choices[index];
  if (choice && choice.text && !isStreaming(choice)) acceptText(node, index, choice.text);
}

/** Adds `added` (all of card `index` of `node`, or the start of it) to the node's story
 * and generates from there. An unsaved edit of the story is kept as a node first. */
function acceptText(node, index, added) {
  if (!added) return;
  const kept = keepDraft();
  stop();
  // The story's new end is what the writer reads next (the card clicked may be far below);
  // the focus stays by the cards for the keyboard, without scrolling the page.
  const box = $("story-box").getBoundingClientRect();
  if (box.top < 0 || box.top > window.innerHeight) $("story-box").scrollIntoView({ block: "start" });
  $("choices").focus({ preventScroll: true });
  const choice = node.choices[index];
  // Of an edited card, the model wrote what is left of its own text at the start.
  const modelChars = choice.edited ? commonStart(added, choice.original ?? "") : added.length;
  start({ parent: node.id, via: index, text: node.text + added, modelChars, kept });
}

function rootOf(id) {
  return state.tree.nodes.get(Tree.pathTo(state.tree, id)[0]);
}

async function start(plan) {
  const bad = Settings.invalidField($("settings"));
  if (bad) {
    $("settings-panel").open = true;
    bad.focus();
    return setStatus(`${bad.name}: ${bad.validationMessage}`, "error");
  }
  const fields = Settings.requestFields(Settings.readForm($("settings")));
  const context = { ...state.tree.context };
  // `from`: the node shown when the writer asked; `tree`: the tree the answer belongs in.
  const run = { controller: new AbortController(), plan, from: state.tree.current };
  Object.assign(run, { tree: state.tree, node: null, undo: null });
  state.run = run;
  setStatus("Sending…");
  setNotice(plan.kept ? `Your edit of the story is kept in the tree as #${plan.kept.id}.` : "");
  render();
  const failure = await Run.stream(run, { ...fields, prompt: buildPrompt(plan.text, context) }, {
    apiKey: Connection.apiKey(),
    session: sessionOf(plan.parent == null ? plan.text : rootOf(plan.parent).text),
    open: () => openNode(run, fields, context),
    update: (index, choice) => {
      if (Tree.currentNode(state.tree) === run.node) Cards.update(index, choice, isStreaming(choice));
    },
  });
  // A run stopped for a newer one (Retry, say) leaves the status to that one.
  if (state.run === run || state.run === null) {
    if (!failure) setStatus("");
    else if (failure.name === "AbortError") setStatus("Stopped.");
    else showError(failure);
  }
  if (failure && run.node?.choices.every((c) => c.text === "")) dropNode(run);
  if (state.run === run) state.run = null;
  saveTree();
  render();
}

/** The server took the request: the node it fills is made now (so a refused request
 * leaves the tree and the shown continuations as they were). */
function openNode(run, fields, context) {
  const { plan } = run;
  const tree = state.tree;
  if (tree !== run.tree) return null; // the tree was replaced meanwhile (undo, import)
  run.undo = record();
  const reuse = plan.reuse && tree.nodes.get(plan.reuse.id);
  const reusable =
    reuse && reuse.choices.length === 0 && (reuse.text === plan.text || Tree.isUnused(tree, reuse));
  const node = reusable
    ? Object.assign(reuse, { text: plan.text })
    : Tree.addNode(tree, {
        parent: plan.parent,
        via: plan.via,
        text: plan.text,
        modelChars: plan.modelChars,
        retryOf: plan.retryOf ?? null,
      });
  node.params = fields;
  node.context = hasContext(context) ? context : null;
  node.stats = null;
  node.choices = Array.from({ length: fields.n ?? 1 }, () => Run.emptyChoice(fields.logprobs));
  Settings.clearErrors($("settings"));
  // Follow the new node unless the writer went elsewhere while the request was sent.
  if (tree.current === run.from) {
    tree.current = node.id;
    showCurrent();
  }
  setStatus(`Generating ${node.choices.length} continuation(s)…`);
  saveTree();
  render();
  return node;
}

/** A failed or stopped generation that produced no text leaves no node behind (nor an
 * undo step); a writer's edit it started from goes back into the story box, or stays a node. */
function dropNode({ node, plan, from, undo }) {
  const tree = state.tree;
  if (!tree.nodes.has(node.id)) return;
  const shown = tree.current === node.id;
  if (plan.reuse?.id === node.id || (plan.draft && !shown)) {
    Object.assign(node, { choices: [], params: null, context: null, stats: null });
    return;
  }
  Tree.deleteSubtree(tree, node.id);
  History.forget(state.history, undo);
  if (!shown) return;
  tree.current = tree.nodes.has(from) ? from : null;
  showCurrent({ draft: plan.draft ? plan.text : null });
}

function isStreaming(choice) {
  return choice.finish_reason === null && state.run?.node?.choices.includes(choice) === true;
}

/** Stops the running generation; what it produced so far stays. */
function stop() {
  const run = state.run;
  if (!run) return;
  // Aborting the fetch closes the connection; the server then cancels the request.
  run.controller.abort();
  state.run = null;
  render();
}

/** The server's message; when it names a setting, that field is marked too. */
function showError(err) {
  if (!(err instanceof ApiError)) {
    return setStatus(`Could not reach the server (${err.message}).`, "error");
  }
  if (err.status === 401) return Connection.needKey(err.message);
  const form = $("settings");
  const key = Settings.fieldOfError(form, err);
  if (key) Settings.markError(form, key, err.message);
  setStatus(`Server: ${err.message}${key ? ` (see ${key} under Settings)` : ""}`, "error");
}

// ---------- words ----------

/** What the word menu needs for the word `span` of a card of the shown node. */
function wordAt(span) {
  const node = Tree.currentNode(state.tree);
  const index = Cards.indexOf(span);
  const i = Number(span.dataset.i);
  const pieces = node.choices[index].pieces;
  const before = Words.textBefore(pieces, i);
  return {
    piece: pieces[i],
    actions: {
      // The word itself is drawn again: the prompt ends just before it (for the first
      // word, that is the node's own text: a retry).
      regenerate: () => (before ? acceptText(node, index, before) : retryFrom(node)),
      useUpTo: () => acceptText(node, index, before + pieces[i].t),
      alternative: (t) => acceptText(node, index, before + t),
    },
  };
}

function retryFrom(node) {
  keepDraft();
  stop();
  start(retryPlan(node));
}

// ---------- the tree: navigation, edits, undo ----------

function jumpTo(id) {
  if (!state.tree.nodes.has(id)) return;
  keepDraft();
  for (const step of Tree.pathTo(state.tree, state.tree.current)) {
    const parent = state.tree.nodes.get(step).parent;
    if (parent !== null) state.lastVisited.set(parent, step);
  }
  state.tree.current = id;
  showCurrent();
  saveTree();
  render();
}

/** The writer's unsaved edit of the story, kept as a node (or, on a node nothing came from
 * yet, as that node's new text) and shown; returns that node, or null if there was none. */
function keepDraft() {
  if (!Story.isDraft()) return null;
  const text = Story.value();
  const node = Tree.currentNode(state.tree);
  record();
  let kept;
  if (node && Tree.isUnused(state.tree, node)) {
    node.text = text;
    kept = node;
  } else {
    kept = Tree.addNode(state.tree, { parent: node?.id ?? null, text });
  }
  state.tree.current = kept.id;
  showCurrent();
  saveTree();
  setNotice(`Your edit of the story is kept in the tree as #${kept.id}.`);
  return kept;
}

function newStory() {
  keepDraft();
  stop();
  state.tree.current = null; // the old story stays in the tree; the next Generate starts a root
  showCurrent();
  saveTree();
  render();
  $("story").focus();
}

function toggleBookmark() {
  const node = Tree.currentNode(state.tree);
  if (!node) return;
  record();
  node.bookmarked = !node.bookmarked;
  saveTree();
  render();
}

function deleteNode() {
  if (!Tree.currentNode(state.tree)) return;
  keepDraft();
  const target = Tree.currentNode(state.tree);
  if (state.run?.node && Tree.pathTo(state.tree, state.run.node.id).includes(target.id)) stop();
  record();
  const count = Tree.deleteSubtree(state.tree, target.id);
  showCurrent();
  saveTree();
  render();
  setNotice(`Deleted ${count} node(s). Undo (Ctrl+Z) brings them back.`);
}

function prune() {
  const node = Tree.currentNode(state.tree);
  if (!node) return;
  const entry = record();
  const count = Tree.pruneSiblings(state.tree, node.id);
  if (count === 0) History.forget(state.history, entry);
  saveTree();
  render();
  setNotice(
    count
      ? `Pruned ${count} node(s) beside #${node.id}. Undo (Ctrl+Z) brings them back.`
      : "Nothing to prune: no other branches here (bookmarked ones are kept).",
  );
}

function reuseSettings() {
  const node = Tree.currentNode(state.tree);
  if (!node?.params) return;
  Settings.writeForm($("settings"), node.params);
  setNotice(`The settings of #${node.id} are in the form again.`);
}

/** Call before each change to the tree, so that Undo can bring it back. */
function record() {
  return History.record(state.history, Tree.clone(state.tree));
}

function undo() {
  keepDraft(); // an unsaved edit is undone like any other change: Redo brings it back
  const past = History.undo(state.history, Tree.clone(state.tree));
  if (past === null) return setStatus("Nothing to undo.");
  restore(past);
  setStatus("Undone.");
}

function redo() {
  const future = History.redo(state.history, Tree.clone(state.tree));
  if (future === null) return setStatus("Nothing to redo.");
  restore(future);
  setStatus("Redone.");
}

function restore(snapshot) {
  stop();
  state.tree = Tree.clone(snapshot); // the snapshot itself stays as it was, for redo
  showCurrent();
  Context.fill(state.tree.context);
  saveTree();
  render();
}

// ---------- import and export ----------

function exportJSON() {
  keepDraft();
  const data = Tree.toJSON(state.tree, state.model);
  Files.download("llama-srb-tree.json", JSON.stringify(data, null, 2), "application/json");
}

/** Asks before touching the tree: the file's nodes go beside it, or replace it. */
async function importJSON(event) {
  const file = event.target.files[0];
  event.target.value = ""; // so choosing the same file again fires `change` again
  if (!file) return;
  let imported;
  try {
    imported = await Files.readTree(file);
  } catch (err) {
    return setStatus(`Could not import ${file.name}: ${err.message}`, "error");
  }
  keepDraft();
  const size = state.tree.nodes.size;
  const answer =
    size === 0
      ? "replace"
      : await ask(
          `Import ${file.name}?`,
          `It holds ${imported.nodes.size} node(s); your tree has ${size}.`,
          [
            { value: "add", label: "Add it beside my tree" },
            { value: "replace", label: "Replace my tree" },
            { value: "cancel", label: "Cancel" },
          ],
        );
  if (answer !== "add" && answer !== "replace") return setStatus("Nothing imported.");
  stop();
  record();
  if (answer === "replace") state.tree = imported;
  else state.tree.current = Tree.merge(state.tree, imported) ?? state.tree.current;
  showCurrent();
  Context.fill(state.tree.context);
  saveTree();
  render();
  setStatus(`Imported ${imported.nodes.size} node(s). Undo (Ctrl+Z) takes it back.`);
}

// ---------- the story box, memory and author's note ----------

/** Shows the current node's text in the story box (or a draft of it). */
function showCurrent({ restoreDraft = false, draft = null } = {}) {
  const node = Tree.currentNode(state.tree);
  const id = node?.id ?? null;
  const runs = node ? Tree.authorship(state.tree, id) : [];
  Story.show(id, node?.text ?? "", runs, draft ?? (restoreDraft ? Story.savedDraft(id) : null));
}

function onStoryInput() {
  $("undo").disabled = state.history.past.length === 0 && !Story.isDraft();
  Context.showSent(Story.value(), state.tree.context);
}

function onContextInput(context) {
  state.tree.context = context;
  saveTreeSoon();
  Context.showSent(Story.value(), context);
}

// ---------- rendering ----------

function render() {
  const node = Tree.currentNode(state.tree);
  const run = state.run;
  Words.hide();
  $("generate").disabled = run !== null;
  $("stop").disabled = run === null;
  $("undo").disabled = state.history.past.length === 0 && !Story.isDraft();
  $("redo").disabled = state.history.future.length === 0;
  // The prompt being continued must match what is shown.
  Story.setReadOnly(run !== null && (run.node === null || run.node === node));
  Cards.render(node, {
    handlers: {
      accept: (index) => acceptCard(node, index),
      edit: (index, text) => editCard(node, index, text),
    },
    branched: (index) =>
      Tree.childrenOf(state.tree, node.id).filter((c) => c.via === index && c.retry_of === null)
        .length,
    isStreaming,
  });
  TreeView.render(state.tree, jumpTo);
  Branches.render(state.tree, node, state.lastVisited, jumpTo);
  NodeInfo.render(node);
  renderStats(node);
  Context.showSent(Story.value(), state.tree.context);
}

function editCard(node, index, text) {
  const choice = node.choices[index];
  if (!choice.edited) choice.original = choice.text;
  choice.text = text;
  choice.edited = true;
  saveTreeSoon();
}

/** The top bar: the shown node's generation (not just the last one of this page). */
function renderStats(node) {
  const s = node?.stats;
  $("stat-ttft").textContent = s?.ttft_ms != null ? `${s.ttft_ms} ms` : "–";
  $("stat-tps").textContent = s?.tokens_per_s != null ? s.tokens_per_s.toFixed(1) : "–";
  $("stat-tokens").textContent = s ? String(s.completion_tokens) : "–";
}

// ---------- small helpers ----------

function commonStart(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

function saveTree() {
  if (!Storage.saveTree(state.tree, state.model)) {
    setStatus("The tree is too big to keep in this browser; export it to keep it.", "error");
  }
}

// Edits save once typing pauses, not on every keystroke: the whole tree is rewritten.
const saveTreeSoon = debounce(saveTree, 400);

init();

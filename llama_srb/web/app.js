// The branching-story UI. The page opens on the library (library.js); a story opens in the
// workbench, where what the writer does (generate, retry, use a card or part of it, go
// elsewhere in the tree, undo) becomes changes to the story's tree (tree.js) and the
// requests they make (run.js), then a redraw. A streaming card can be forked, dropped or
// steered (live.js), each fork a generation of its own beside the writer's. Every change
// is saved as it happens (sync.js: to the server, and a copy in this browser). Each story
// is written with the model picked for it (models.js), which its requests name. Drawing,
// keys, merging and storage live in the other modules.

import { ApiError, live, sessionOf } from "./api.js";
import { ask } from "./ask.js";
import * as Branches from "./branches.js";
import * as Budget from "./budget.js";
import * as Cards from "./cards.js";
import * as Connection from "./connection.js";
import * as Context from "./context.js";
import { $, debounce } from "./dom.js";
import * as Files from "./files.js";
import * as History from "./history.js";
import * as Keys from "./keys.js";
import * as Library from "./library.js";
import * as Live from "./live.js";
import * as Merge from "./merge.js";
import * as Models from "./models.js";
import * as NodeInfo from "./nodeinfo.js";
import * as Progress from "./progress.js";
import { buildPrompt, hasContext } from "./prompt.js";
import * as Run from "./run.js";
import * as Settings from "./settings.js";
import { setNotice, setStatus } from "./status.js";
import * as Story from "./story.js";
import { StorySync } from "./sync.js";
import * as Tree from "./tree.js";
import * as TreeView from "./treeview.js";
import { upgrade } from "./upgrade.js";
import * as Words from "./words.js";

// A card still follows a story edited before its last TAIL characters (a fixed typo):
// "Use this" appends it. An edit nearer the end asks first.
const TAIL = 40;

const state = {
  storyId: null, // the open story (null: the library is shown)
  opening: null, // the story being opened
  sync: null, // its StorySync
  tree: Tree.createTree(),
  run: null, // {controller, plan, from, tree, node, undo, id, session} while generating
  forks: [], // the same, for each fork of a streaming card while it streams
  warm: null, // {controller, prompt} while a story is read into the cache
  history: History.createHistory(),
  lastVisited: new Map(), // node id → the child the writer last came back from, for →
};

function init() {
  Settings.buildForm($("settings"), onSettingsInput);
  Story.init(onStoryInput);
  Context.init(onContextInput);
  Words.init($("choices"), wordAt);
  new ResizeObserver(() => Cards.balance()).observe($("choices"));
  Library.init({
    open: (id) => (location.hash = `#story=${id}`),
    create: () => newStory(),
    importFile: importAsStory,
    apiKey: Connection.apiKey,
    needKey: Connection.needKey,
  });
  wireButtons();
  // The keys act on the open story (none while the library is shown).
  const open = (fn) => (...args) => (state.storyId ? fn(...args) : false);
  Keys.bind({
    // Inside a card, Ctrl+Enter takes that card, as its "Use this" would.
    useCard: open((target) => {
      const index = Cards.indexOf(target);
      if (index !== null) acceptCard(Tree.currentNode(state.tree), index);
      return index !== null;
    }),
    generate: open(generate),
    escape: open(() => {
      if (Words.isOpen()) Words.hide();
      else if (runs().length) stop();
      else return false;
      return true;
    }),
    retry: open(retry),
    undo: open(undo),
    redo: open(redo),
    move: open((key) => {
      const id = TreeView.target(state.tree, key, state.lastVisited);
      if (id !== null && id !== undefined) jumpTo(id);
    }),
    fold: open(() => {
      if (TreeView.toggle(state.tree, state.tree.current)) render();
    }),
    bookmark: open(toggleBookmark),
    remove: open(deleteNode),
  });
  // A reload or a closed tab must not lose a pending change; it stops a generation too.
  window.addEventListener("pagehide", () => {
    for (const run of runs()) Run.finishOpen(run.node, "stopped");
    saveTree();
    state.sync?.leave();
  });
  window.addEventListener("hashchange", route);
  Models.init({ apiKey: Connection.apiKey, picked: onModelPick });
  Connection.init(
    (cards) => {
      Models.setCards(cards);
      if (cards) state.sync?.retry();
    },
    () => {
      state.sync?.retry();
      if (!state.storyId) route();
    },
  );
  // The old browser-only tree becomes stories of the library first (once).
  upgrade(Connection.apiKey(), Story.draftKeyOf)
    .then(({ ids, refused }) => {
      if (refused.length) {
        setNotice(`Not moved into the library (kept in this browser): ${refused.join("; ")}`);
      }
      return ids.length ? `Your stories from this browser are in the library now.` : "";
    })
    .catch(() => "")
    .then((message) => route(message));
}

// ---------- the library and the open story ----------

/** Shows what the address says: a story (#story=<id>) or the library. */
function route(message = "") {
  const id = new URLSearchParams(location.hash.slice(1)).get("story");
  if (id) openStory(id);
  else showLibrary(typeof message === "string" ? message : "");
}

function showLibrary(message = "") {
  leaveStory();
  Models.showLibrary();
  $("story-view").hidden = true;
  $("story-title").hidden = true;
  $("library").hidden = false;
  document.title = "llama-srb · your stories";
  Library.show(message);
}

async function openStory(id) {
  if (id === state.storyId || id === state.opening) return;
  leaveStory();
  state.opening = id;
  $("library").hidden = true;
  let sync;
  try {
    sync = await StorySync.open(id, syncHooks(id));
  } catch (err) {
    state.opening = null;
    // Neither the server nor this browser has it (made and left at once, say): it starts
    // again, empty, with what the writer typed (its draft is kept apart).
    if (err.status === 404) return newStory(undefined, id);
    const why = err.status === 410 ? "it is in the trash" : err.message;
    location.hash = "";
    return showLibrary(`Could not open that story: ${why}.`);
  }
  if (state.opening !== id) return sync.close(); // the writer went elsewhere meanwhile
  state.opening = null;
  show(sync);
}

/** A new story, made in this browser and saved to the server by its first save. */
function newStory(tree = Tree.createTree({ settings: Settings.defaults() }), id = newId()) {
  leaveStory();
  show(StorySync.create(id, tree, syncHooks(id)));
  location.hash = `#story=${id}`;
  $("story").focus();
}

function show(sync) {
  const tree = sync.tree;
  state.storyId = sync.id;
  state.sync = sync;
  state.tree = tree;
  state.history = sync.history;
  state.lastVisited = new Map();
  Story.setStory(sync.id);
  TreeView.setStory(sync.id);
  Settings.fill($("settings"), tree.settings);
  Context.fill(tree.context);
  showModel();
  $("story-name").value = tree.name;
  $("library").hidden = true;
  $("story-view").hidden = false;
  $("story-title").hidden = false;
  document.title = `${tree.name || "Untitled story"} · llama-srb`;
  setStatus("");
  setNotice("");
  Progress.hide();
  showCurrent({ restoreDraft: true });
  render();
  warm();
}

function leaveStory() {
  state.opening = null;
  if (!state.storyId) return;
  keepDraft();
  stop();
  state.warm?.controller.abort();
  saveTree();
  const leaving = state.sync;
  leaving.keep();
  leaving.flush().finally(() => leaving.close()); // it saves what is left, then stops
  state.storyId = null;
  state.sync = null;
}

function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return btoa(String.fromCharCode(...bytes)).replaceAll("+", "-").replaceAll("/", "_");
}

/** What sync.js needs from the page, for story `id` (while it is the one shown). */
function syncHooks(id) {
  const shown = () => state.storyId === id;
  return {
    apiKey: Connection.apiKey,
    onRenumber: (moves) => {
      if (!shown()) return;
      Story.renumber(moves);
      const to = (x) => (moves.has(x) ? moves.get(x) : x);
      state.lastVisited = new Map([...state.lastVisited].map(([a, b]) => [to(a), to(b)]));
      for (const run of runs()) {
        run.from = to(run.from);
        if (run.plan.parent != null) run.plan.parent = to(run.plan.parent);
      }
    },
    onMerged: () => {
      if (!shown()) return;
      const tree = state.tree;
      if (tree.current !== null && !tree.nodes.has(tree.current)) tree.current = null;
      $("story-name").value = tree.name;
      const node = Tree.currentNode(tree);
      if (!Story.isDraft() && Story.value() !== (node?.text ?? "")) showCurrent();
      Context.fill(tree.context);
      Settings.fill($("settings"), tree.settings);
      if ((tree.model ?? null) !== Models.picked()) showModel();
      render();
    },
    ask: askAboutConflicts,
    onStatus: (kind, message) => {
      if (!shown() && state.opening !== id) return;
      $("save-state").textContent = message;
      $("save-state").dataset.kind = kind;
    },
    onGone: () =>
      ask("This story was deleted", "It was deleted in another tab or on another device.", [
        { value: "restore", label: "Keep it (restore it)" },
        { value: "close", label: "Let it go" },
      ]),
    needKey: Connection.needKey,
  };
}

/** Others changed what the writer changed: one question for all the clashes. */
async function askAboutConflicts(conflicts) {
  const list = conflicts.slice(0, 6).map(Merge.describe).join("; ");
  const more = conflicts.length > 6 ? ` and ${conflicts.length - 6} more` : "";
  const nodes = conflicts.some((c) => c.kind !== "meta");
  const answers = [
    nodes && { value: "both", label: "Keep both" },
    { value: "mine", label: "Keep mine" },
    { value: "theirs", label: "Keep theirs" },
  ].filter(Boolean);
  const answer = await ask(
    "This story changed elsewhere too",
    `It was changed in another tab or on another device, where ${conflicts.length} of your` +
      ` changes were changed too: ${list}${more}. Keep both keeps every version (yours of` +
      " a node as a copy beside it).",
    answers,
  );
  setNotice(
    answer === "theirs"
      ? "The other version is kept; Undo (Ctrl+Z) does not bring yours back, Export first if unsure."
      : answer === "mine"
        ? "Your version is kept."
        : "Both versions are kept.",
  );
  return answer ?? (nodes ? "both" : "mine");
}

// ---------- generating ----------

/** Continues the story as the box shows it: the writer's edit becomes a node of its own;
 * the same text as the node's gives that node (again) new continuations. */
function generate() {
  if (state.run || !state.storyId) return;
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
    viaNode: node.via_node,
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

/** Adds `added` (all of card `index` of `node`, or the start of it) to the story and
 * generates from there. When the writer edited the story box, the card goes after the
 * edit (the edit kept as a node first): at once if the edit leaves the end the card
 * followed, else the writer is asked. */
async function acceptText(node, index, added) {
  if (!added) return;
  const choice = node.choices[index];
  // Of an edited card, the model wrote what is left of its own text at the start.
  const modelChars = choice.edited ? commonStart(added, choice.original ?? "") : added.length;
  let parent = node;
  if (Story.isDraft()) {
    const { suffix } = Tree.change(node.text, Story.value());
    if (suffix < Math.min(TAIL, node.text.length)) {
      const answer = await ask(
        "Your edit changed the end of the story",
        "This continuation followed the story as it was before your edit, so it may not" +
          " follow your text. Generate new continuations for your text instead?",
        [
          { value: "generate", label: "Generate for my text" },
          { value: "append", label: "Add this one anyway" },
          { value: "cancel", label: "Cancel" },
        ],
      );
      if (answer === "generate") return generate();
      if (answer !== "append") return;
    }
    parent = keepDraft(); // the edit, a node of its own: the card goes after it
  }
  stop();
  // The story's new end is what the writer reads next (the card clicked may be far below);
  // the focus stays by the cards for the keyboard, without scrolling the page.
  const box = $("story-box").getBoundingClientRect();
  if (box.top < 0 || box.top > window.innerHeight) $("story-box").scrollIntoView({ block: "start" });
  $("choices").focus({ preventScroll: true });
  start({
    parent: parent.id,
    via: index,
    viaNode: parent === node ? null : node.id,
    text: parent.text + added,
    modelChars,
    kept: parent === node ? null : parent,
  });
}

function rootOf(id) {
  return state.tree.nodes.get(Tree.pathTo(state.tree, id)[0]);
}

/** The prompt for `text`: with memory and note, and the story's start left out if the
 * model's context cannot hold it and the continuations (budget.js). */
function promptFor(text, context, fields) {
  const plan = Budget.fit(text, context, Budget.reserve(fields));
  return buildPrompt(plan.story, context);
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
  // `from`: the node shown when the writer asked; `tree`: the tree the answer belongs in;
  // `session`: what the server knows the writer by (a fork, drop or steer must say it too).
  const run = { controller: new AbortController(), plan, from: state.tree.current };
  const session = sessionOf(plan.parent == null ? plan.text : rootOf(plan.parent).text);
  Object.assign(run, { tree: state.tree, node: null, undo: null, id: null, session });
  state.run = run;
  state.warm?.controller.abort(); // what it read so far stays in the cache
  const model = Models.requested();
  const loading = Models.mustLoad();
  setStatus(loading ? `Loading the model ${loading}…` : "Sending…");
  if (loading) Models.expect();
  setNotice(plan.kept ? `Your edit of the story is kept in the tree as #${plan.kept.id}.` : "");
  render();
  await Budget.countNow(plan.text, context, Connection.apiKey());
  Progress.start("generate");
  const body = { ...fields, prompt: promptFor(plan.text, context, fields) };
  if (model) body.model = model;
  // The node's settings name the model asked for (its pick, else the server's current one
  // as listed), set once as it is made: a saved node is not changed for it afterwards.
  const writer = model || Models.current();
  const made = writer ? { ...fields, model: writer } : fields;
  const failure = await Run.stream(run, body, {
    apiKey: Connection.apiKey(),
    session,
    open: () => openNode(run, made, context),
    update: (index, choice) => showUpdate(run, index, choice),
    progress: Progress.update,
    loading: (name, seconds) => {
      Models.loading(name, seconds);
      run.loading = true;
      if (state.run === run) setStatus(`Loading the model ${name} (${seconds} s)…`);
    },
  });
  Progress.finish();
  Models.expect(); // what the request loaded, or left asleep
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

/** A card of `run` changed: shown (a refill's new card: the cards drawn again) and saved. */
function showUpdate(run, index, choice) {
  if (run.loading) {
    // The model it waited for is loaded: its words are coming.
    run.loading = false;
    Models.expect();
    if (state.run === run) setStatus(`Generating ${run.node.choices.length} continuation(s)…`);
  }
  if (Tree.currentNode(state.tree) === run.node) {
    if (Cards.has(index)) Cards.update(index, choice);
    else render();
  }
  state.sync?.changed(); // saved as it streams (at most a few times a second)
}

/** The server took the request: the node it fills is made now (so a refused request
 * leaves the tree and the shown continuations as they were). A fork's node does not take
 * the view: the writer goes on reading the cards it came from. */
function openNode(run, fields, context) {
  const { plan } = run;
  const tree = state.tree;
  if (tree !== run.tree) return null; // another story was opened meanwhile
  if (plan.fork && !tree.nodes.has(plan.parent)) return null; // its card's node was deleted
  run.undo = record();
  const reuse = plan.reuse && tree.nodes.get(plan.reuse.id);
  const reusable =
    reuse && reuse.choices.length === 0 && (reuse.text === plan.text || Tree.isUnused(tree, reuse));
  const node = reusable
    ? Object.assign(reuse, { text: plan.text })
    : Tree.addNode(tree, {
        parent: plan.parent,
        via: plan.via,
        viaNode: plan.viaNode ?? null,
        text: plan.text,
        modelChars: plan.modelChars,
        retryOf: plan.retryOf ?? null,
      });
  node.params = fields;
  node.context = hasContext(context) ? context : null;
  node.stats = null;
  node.choices = Array.from({ length: fields.n ?? 1 }, () => Run.emptyChoice(fields.logprobs));
  run.node = node; // its cards are drawn streaming from the start
  Settings.clearErrors($("settings"));
  // Follow the new node unless the writer went elsewhere while the request was sent.
  if (tree.current === run.from && !plan.fork) {
    tree.current = node.id;
    showCurrent();
  }
  setStatus(
    plan.fork
      ? `Forking #${plan.via + 1}: ${node.choices.length} continuation(s) in #${node.id}…`
      : `Generating ${node.choices.length} continuation(s)…`,
  );
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

/** The generations streaming now: the writer's, and the forks of its cards. */
function runs() {
  return [state.run, ...state.forks].filter(Boolean);
}

function isStreaming(choice) {
  return choice.finish_reason === null && runs().some((r) => r.node?.choices.includes(choice));
}

/** Stops the running generation and its forks; what they produced so far stays. */
function stop() {
  const stopping = runs();
  if (stopping.length === 0) return;
  // Aborting the fetch closes the connection; the server then cancels the request.
  for (const run of stopping) run.controller.abort();
  state.run = null;
  state.forks = [];
  render();
}

// ---------- live branching: fork, drop and steer a streaming card ----------

/** The streaming call that fills `node`, when the server can act on its cards now: it has
 * named itself (its first chunk), and is a stream (best_of's answer comes whole). */
function liveCall(node) {
  const run = runs().find((r) => r.node === node);
  const whole = (node.params?.best_of ?? 0) > (node.params?.n ?? 1);
  return run?.id && !whole ? run : null;
}

/** Who may act on a call: the key and session that made it. */
function authOf(run) {
  return { apiKey: Connection.apiKey(), session: run.session };
}

/** More continuations of card `index` (as many as the form's n) from `caret` in its text,
 * else from as far as it has come: a node of their own, a child of `node` by that card
 * (its text: the story and the card up to there), generated beside the running ones. */
async function forkCard(node, index, caret) {
  const call = liveCall(node);
  const choice = node.choices[index];
  if (!call || !choice) return;
  const head = choice.text.slice(0, caret ?? choice.text.length);
  const asked = Settings.requestFields(Settings.readForm($("settings"))).n;
  const k = Number.isInteger(asked) && asked > 0 ? asked : (node.params?.n ?? 1);
  // The server sends what follows the fork point; `at` makes that what the writer has read.
  const body = { n: k, at: Live.codePoints(head) };
  // A temperature spread gave each card its own: the fork's continue with this card's.
  if (node.params?.choices_params) {
    Object.assign(body, { choices_params: null, ...node.params.choices_params[index] });
  }
  const fields = { ...node.params, ...body }; // what the fork's node was generated with
  delete fields.at;
  delete fields.choices_params;
  const plan = { fork: true, parent: node.id, via: index, text: node.text + head };
  plan.modelChars = head.length;
  const run = { controller: new AbortController(), plan, from: node.id, tree: state.tree };
  Object.assign(run, { node: null, undo: null, id: null, session: call.session });
  state.forks.push(run);
  render();
  const failure = await Run.stream(run, body, {
    path: live.forkPath(call.id, index),
    apiKey: Connection.apiKey(),
    session: run.session,
    open: () => openNode(run, fields, node.context ?? Tree.emptyContext()),
    update: (i, c) => showUpdate(run, i, c),
  });
  const mine = state.forks.includes(run); // not stopped since
  state.forks = state.forks.filter((r) => r !== run);
  if (failure && failure.name !== "AbortError") showError(failure);
  else if (mine && !failure) setStatus(`Fork #${run.node?.id} is done.`);
  if (failure && run.node?.choices.every((c) => c.text === "")) dropNode(run);
  saveTree();
  render();
}

/** Ends card `index` now ("dropped"); with `refill`, a fresh one from the same prompt
 * streams in its place, as a new card of the same node. */
async function dropCard(node, index, refill) {
  const call = liveCall(node);
  if (!call) return;
  try {
    const answer = await live.drop(call.id, index, refill, authOf(call));
    const more = answer.refill === null ? "" : `; #${answer.refill + 1} comes in its place`;
    setStatus(`#${index + 1} dropped${more}.`);
    if (answer.refill !== null && runs().includes(call)) {
      Run.grow(node, answer.refill); // unless its first words came before this answer
      if (Tree.currentNode(state.tree) === node) render();
    }
  } catch (err) {
    liveError(err, index);
  }
}

/** The writer's `words` into card `index` as if the model wrote them: they come back on
 * the stream (so the card shows them once). Throws when they did not go in. */
async function steerCard(node, index, words) {
  const call = liveCall(node);
  if (!call) throw new Error("the card has ended");
  try {
    await live.steer(call.id, index, { append: words }, authOf(call));
  } catch (err) {
    liveError(err, index);
    throw err;
  }
}

function liveError(err, index) {
  // 409: the card (or its whole call) ended while the writer acted; nothing is lost.
  if (err instanceof ApiError && err.status === 409) setStatus(`#${index + 1} had already ended.`);
  else showError(err);
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

/** Opening a story reads it into the server's prefix cache (a request with max_tokens 0
 * on the prompt the next Generate sends), so its first continuations start at once. */
async function warm() {
  const node = Tree.currentNode(state.tree);
  if (!node?.text.trim() || state.run) return;
  const fields = Settings.requestFields(Settings.readForm($("settings")));
  const context = { ...state.tree.context };
  await Budget.countNow(node.text, context, Connection.apiKey());
  if (state.run || Tree.currentNode(state.tree) !== node) return;
  const prompt = promptFor(node.text, context, fields);
  state.warm?.controller.abort();
  const warming = { controller: new AbortController(), prompt };
  state.warm = warming;
  Progress.start("warm");
  const failure = await Run.warm(prompt, {
    apiKey: Connection.apiKey(),
    session: sessionOf(rootOf(node.id).text),
    signal: warming.controller.signal,
    progress: Progress.update,
    loading: Models.loading,
    model: Models.requested(),
  });
  Models.expect();
  if (state.warm !== warming) return;
  state.warm = null;
  if (failure) Progress.hide();
  else Progress.finish();
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
  const under = (run) => run.node && Tree.pathTo(state.tree, run.node.id).includes(target.id);
  if (runs().some(under)) stop();
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
  onSettingsInput(Settings.readForm($("settings")));
  setNotice(`The settings of #${node.id} are in the form again.`);
}

/** Call before each change to the tree, so that Undo can bring it back. */
function record() {
  return History.record(state.history, state.tree);
}

function undo() {
  keepDraft(); // an unsaved edit is undone like any other change: Redo brings it back
  stop();
  if (!History.undo(state.history, state.tree)) return setStatus("Nothing to undo.");
  restored();
  setStatus("Undone.");
}

function redo() {
  stop();
  if (!History.redo(state.history, state.tree)) return setStatus("Nothing to redo.");
  restored();
  setStatus("Redone.");
}

function restored() {
  showCurrent();
  Context.fill(state.tree.context);
  Settings.fill($("settings"), state.tree.settings);
  state.sync?.changed();
  render();
}

// ---------- import and export ----------

function exportJSON() {
  keepDraft();
  const data = Tree.toJSON(state.tree, Models.effective());
  Files.download(`${fileName()}.json`, JSON.stringify(data, null, 2), "application/json");
}

function fileName() {
  return (state.tree.name || "story").replace(/[^\p{L}\p{N} _-]+/gu, "").trim() || "story";
}

/** Asks before touching the story: the file's nodes go into it, or become a new story. */
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
      ? "fill"
      : await ask(
          `Import ${file.name}?`,
          `It holds ${imported.nodes.size} node(s); this story has ${size}.`,
          [
            { value: "add", label: "Add it to this story" },
            { value: "new", label: "Open it as a new story" },
            { value: "cancel", label: "Cancel" },
          ],
        );
  if (answer === "new") return importTree(imported, file.name);
  if (answer !== "add" && answer !== "fill") return setStatus("Nothing imported.");
  stop();
  record();
  if (answer === "fill") fillStory(imported, file.name);
  else state.tree.current = Tree.merge(state.tree, imported) ?? state.tree.current;
  showCurrent();
  Context.fill(state.tree.context);
  saveTree();
  render();
  setStatus(`Imported ${imported.nodes.size} node(s). Undo (Ctrl+Z) takes it back.`);
}

/** An empty story takes the file whole: its nodes, memory, note, settings and name. */
function fillStory(imported, fileName) {
  const tree = state.tree;
  Object.assign(tree, {
    nodes: imported.nodes, current: imported.current, nextId: imported.nextId,
    context: imported.context,
  });
  if (Object.keys(imported.settings).length) tree.settings = imported.settings;
  tree.name = tree.name || imported.name || fileName.replace(/\.json$/i, "");
  $("story-name").value = tree.name;
  Settings.fill($("settings"), tree.settings);
}

/** A file from the library's "Import a story…" (or "as a new story"): a new story. */
async function importAsStory(file) {
  let imported;
  try {
    imported = await Files.readTree(file);
  } catch (err) {
    return Library.show(`Could not import ${file.name}: ${err.message}`);
  }
  importTree(imported, file.name);
}

function importTree(imported, fileName) {
  imported.name ||= fileName.replace(/\.json$/i, "");
  if (!Object.keys(imported.settings).length) imported.settings = Settings.defaults();
  newStory(imported);
  setStatus(`Imported ${imported.nodes.size} node(s) as a new story.`);
}

// ---------- the story box, memory and author's note ----------

/** Shows the current node's text in the story box (or a draft of it). */
function showCurrent({ restoreDraft = false, draft = null } = {}) {
  const node = Tree.currentNode(state.tree);
  const id = node?.id ?? null;
  const runs = node ? Tree.authorship(state.tree, id) : [];
  Story.show(id, node?.text ?? "", runs, draft ?? (restoreDraft ? Story.savedDraft(id) : null));
  showBudget();
}

function onStoryInput() {
  $("undo").disabled = !History.canUndo(state.history) && !Story.isDraft();
  Context.showSent(sentStory(), state.tree.context);
  showBudget();
}

function onContextInput(context) {
  state.tree.context = context;
  state.sync?.changed();
  Context.showSent(sentStory(), context);
  showBudget();
}

/** The story's model in the picker, and the counts of its tokens. */
function showModel() {
  Models.showStory(state.tree.model ?? null);
  Budget.setModel(Models.requested());
}

/** The writer picked `name` (null: the server's current model) for the open story: kept
 * with it, and the story read into that model's cache (loading it, if it sleeps). */
function onModelPick(name) {
  if (!state.storyId) return;
  state.tree.model = name;
  state.sync?.changed();
  Budget.setModel(Models.requested());
  const served = name === Models.requested();
  setNotice(
    name === null
      ? "This story is written by the server's current model."
      : served
        ? `This story is written by ${name} from now on (kept with the story).`
        : `${name} is not served here: the server's current model writes this story.`,
  );
  showBudget();
  warm();
}

function onSettingsInput(values) {
  state.tree.settings = values;
  state.sync?.changed();
  showBudget();
}

function onNameInput() {
  state.tree.name = $("story-name").value.trim();
  document.title = `${state.tree.name || "Untitled story"} · llama-srb`;
  state.sync?.changed();
}

/** The story as the next prompt carries it (its start left out when it must be). */
function sentStory() {
  const fields = Settings.requestFields(Settings.readForm($("settings")));
  return Budget.fit(Story.value(), state.tree.context, Budget.reserve(fields)).story;
}

/** The word count and the context bar, counted again once typing pauses. */
function showBudget() {
  const fields = Settings.requestFields(Settings.readForm($("settings")));
  const text = Story.value();
  Budget.show(text, state.tree.context, Budget.reserve(fields));
  Budget.count(text, state.tree.context, Connection.apiKey(), () => {
    if (Story.value() === text) Budget.show(text, state.tree.context, Budget.reserve(fields));
  });
}

// ---------- rendering ----------

function render() {
  if (!state.storyId) return;
  const node = Tree.currentNode(state.tree);
  const run = state.run;
  Words.hide();
  $("generate").disabled = run !== null;
  $("stop").disabled = runs().length === 0;
  $("undo").disabled = !History.canUndo(state.history) && !Story.isDraft();
  $("redo").disabled = state.history.future.length === 0;
  // The prompt being continued must match what is shown.
  Story.setReadOnly(run?.node === null || runs().some((r) => r.node === node));
  Cards.render(node, {
    handlers: {
      accept: (index) => acceptCard(node, index),
      edit: (index, text) => editCard(node, index, text),
      fork: (index, caret) => forkCard(node, index, caret),
      drop: (index, refill) => dropCard(node, index, refill),
      steer: (index, words) => steerCard(node, index, words),
      keep: (index, words) => {
        editCard(node, index, node.choices[index].text + words);
        setNotice(`Card #${index + 1} ended before your words went in: they are added to it.`);
      },
    },
    branched: (index) =>
      [...state.tree.nodes.values()].filter(
        (c) => (c.via_node ?? c.parent) === node.id && c.via === index && c.retry_of === null,
      ).length,
    isStreaming,
    isLive: (choice) => Boolean(liveCall(node)) && node.choices.includes(choice),
  });
  const found = TreeView.render(state.tree, jumpTo);
  $("tree-found").textContent = found === null ? "" : `${found} found`;
  Branches.render(state.tree, node, state.lastVisited, jumpTo);
  NodeInfo.render(node);
  renderStats(node);
  Context.showSent(sentStory(), state.tree.context);
}

function editCard(node, index, text) {
  const choice = node.choices[index];
  if (!choice.edited) choice.original = choice.text;
  choice.text = text;
  choice.edited = true;
  state.sync?.coming(); // "Saved" would be untrue until the save made when typing pauses
  saveTreeSoon();
}

/** The top bar: the shown node's generation (not just the last one of this page). */
function renderStats(node) {
  const s = node?.stats;
  $("stat-ttft").textContent = s?.ttft_ms != null ? `${s.ttft_ms} ms` : "–";
  $("stat-tps").textContent = s?.tokens_per_s != null ? s.tokens_per_s.toFixed(1) : "–";
  $("stat-tokens").textContent = s ? String(s.completion_tokens) : "–";
}

function wireButtons() {
  const on = (id, fn) => $(id).addEventListener("click", fn);
  on("generate", generate);
  on("retry", retry);
  on("stop", stop);
  on("undo", undo);
  on("redo", redo);
  on("export-text", () => Files.download(`${fileName()}.txt`, Story.value(), "text/plain"));
  on("export-json", exportJSON);
  on("import-json", () => $("import-file").click());
  $("import-file").addEventListener("change", importJSON);
  on("new-story", () => newStory());
  on("bookmark", toggleBookmark);
  on("delete-node", deleteNode);
  on("prune", prune);
  on("reuse-settings", reuseSettings);
  on("tree-fold", () => {
    TreeView.foldOthers(state.tree);
    render();
  });
  $("story-name").addEventListener("input", debounce(onNameInput, 300));
  $("tree-search").addEventListener(
    "input",
    debounce(() => {
      TreeView.setQuery($("tree-search").value);
      render();
    }, 150),
  );
  $("tree-search").addEventListener("keydown", (event) => {
    if (event.key !== "Enter") return;
    // Enter: the next node that matches (after the current one, round again).
    const ids = TreeView.found(state.tree);
    const next = ids.find((id) => id > (state.tree.current ?? 0)) ?? ids[0];
    if (next !== undefined) jumpTo(next);
  });
  $("sent").addEventListener("toggle", () => Context.showSent(sentStory(), state.tree.context));
}

// ---------- small helpers ----------

function commonStart(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

/** After each change: the undo step is closed and the story saved (sync.js). A story
 * without a name takes the first words of its text. */
function saveTree() {
  if (!state.storyId) return;
  History.commit(state.history, state.tree);
  const tree = state.tree;
  if (!tree.name && !$("story-name").value.trim()) {
    const first = Tree.childrenOf(tree, null)[0];
    tree.name = first ? Tree.nameFrom(first.text) : "";
    $("story-name").value = tree.name;
  }
  state.sync?.changed();
}

// Card edits save once typing pauses, as one undo step per pause.
const saveTreeSoon = debounce(saveTree, 400);

init();

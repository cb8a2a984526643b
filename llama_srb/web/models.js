// The models the server serves (GET /v1/models, each with its state) and the one the open
// story is written with: the picker in the top bar. A story's pick is kept with it in the
// library (`tree.model`; null: the server's current model, as every story made before);
// its requests name it, and the server loads it on demand. A pick the server no longer
// serves is shown as such and the story falls back to the server's current model.
// The list is read again when the picker is opened, after each request, every POLL_MS,
// and every BUSY_MS while a model loads.

import { fetchModels } from "./api.js";
import { $, el } from "./dom.js";

const POLL_MS = 15_000;
const BUSY_MS = 1_000;
const EXPECT_MS = 4_000; // after a request that may load a model: polled as if loading
const WORDS = {
  loaded: "loaded",
  loading: "loading…",
  unloading: "unloading…",
  sleeping: "asleep",
  available: "not loaded",
  failed: "failed to load",
};

let cards = null; // [{id, state, error}] as last read; null: not known (no answer yet)
let pick = null; // the open story's model (null: none, the server's current one)
let open = false; // a story is shown
let notice = null; // {name, seconds}: a stream says its model is loading
let expectUntil = 0;
let timer = null;
let getKey = () => "";
let onPick = () => {};

/** `apiKey()` gives the key for reading the list; `picked(name | null)` hears the
 * writer's pick for the open story. */
export function init({ apiKey, picked }) {
  getKey = apiKey;
  onPick = picked;
  const select = $("model-pick");
  select.addEventListener("change", () => {
    pick = select.value || null;
    render();
    onPick(pick);
  });
  // Opening the picker reads the states again.
  select.addEventListener("pointerdown", () => refresh());
  select.addEventListener("focus", () => refresh());
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refresh();
  });
}

/** The list as the connection check read it (null: it could not). */
export function setCards(list) {
  cards = list;
  if (list && notice && stateOf(notice.name) !== "loading") notice = null;
  render();
  schedule();
}

/** Reads the list again (a failure keeps the last one: the connection check says why). */
export async function refresh() {
  try {
    setCards(await fetchModels(getKey()));
  } catch {
    schedule();
  }
}

/** The story shown now, and its pick. */
export function showStory(model) {
  open = true;
  pick = model ?? null;
  notice = null;
  expect();
  render();
  refresh();
}

export function showLibrary() {
  open = false;
  pick = null;
  notice = null;
  render();
}

/** The open story's pick as the picker holds it (null: none). */
export function picked() {
  return pick;
}

/** What the open story's requests name: its pick, unless the server does not serve it
 * (then none: the server's current model). */
export function requested() {
  if (!pick) return null;
  return cards === null || served(pick) ? pick : null;
}

/** The model that writes the open story (or, in the library, the server's current one). */
export function effective() {
  return (open && requested()) || current();
}

/** The model a request that names none gets: the loaded one (the first, if several),
 * else the server's first (its default). */
export function current() {
  if (!cards?.length) return "";
  return (cards.find((c) => c.state === "loaded") ?? cards[0]).id;
}

/** Whether the open story's model must load before it writes (its name, else null). */
export function mustLoad() {
  const name = effective();
  const state = stateOf(name);
  return name && state && state !== "loaded" ? name : null;
}

/** A stream waits for `name` to load (the server's notice, `seconds` so far). */
export function loading(name, seconds) {
  notice = { name, seconds };
  const card = cards?.find((c) => c.id === name);
  if (card && card.state !== "loading") card.state = "loading";
  render();
  schedule();
}

/** A request went or ended: the list is read now, and polled closely for a while (a load
 * it started shows). */
export function expect() {
  expectUntil = Date.now() + EXPECT_MS;
  notice = null;
  refresh();
}

function served(name) {
  return Boolean(cards?.some((c) => c.id === name));
}

function stateOf(name) {
  return cards?.find((c) => c.id === name)?.state ?? null;
}

function schedule() {
  clearTimeout(timer);
  if (cards === null) return; // the connection check reads it again (a key given, say)
  const busy =
    notice !== null ||
    Date.now() < expectUntil ||
    Boolean(cards?.some((c) => c.state === "loading" || c.state === "unloading"));
  timer = setTimeout(() => {
    if (document.visibilityState === "visible") refresh();
    else schedule();
  }, busy ? BUSY_MS : POLL_MS);
}

function render() {
  const label = $("model-name");
  const select = $("model-pick");
  const status = $("model-state");
  if (cards === null) {
    // Not known: the label says why (connection.js); nothing to pick from.
    select.hidden = true;
    status.hidden = true;
    label.hidden = false;
    return;
  }
  const missing = open && pick !== null && !served(pick);
  const choosing = open && (cards.length > 1 || missing);
  // A label that says what is wrong (a key needed: connection.js) stays until it is fixed.
  const failing = label.classList.contains("error");
  label.hidden = choosing && !failing;
  if (!failing) label.textContent = effective() || "(no model)";
  select.hidden = !choosing;
  if (choosing) {
    const options = [
      { value: "", text: `server's current (${current()})` },
      ...cards.map((c) => ({ value: c.id, state: c.state, text: `${c.id} · ${WORDS[c.state] ?? c.state}` })),
    ];
    if (missing) options.push({ value: pick, text: `${pick} · not served here` });
    fillOptions(select, options);
    select.value = pick ?? "";
    select.title = "the model this story is written with (kept with the story)";
  }
  const { text, kind } = open ? stateText(missing) : { text: "", kind: "" };
  status.textContent = text;
  status.dataset.kind = kind;
  status.hidden = text === "";
}

/** The picker's options; the same models as shown are updated in place, so a list read
 * again while the writer has the picker open does not close it. */
function fillOptions(select, options) {
  const same =
    select.options.length === options.length &&
    options.every((o, i) => select.options[i].value === o.value);
  if (!same) {
    select.replaceChildren(...options.map((o) => el("option", { value: o.value })));
  }
  options.forEach((o, i) => {
    const shown = select.options[i];
    if (shown.textContent !== o.text) shown.textContent = o.text;
    if (o.state) shown.dataset.state = o.state;
  });
}

/** A word on the open story's model, when there is something to say. */
function stateText(missing) {
  if (missing) {
    return {
      text: `${pick} is not served here: ${current() || "the server's current model"} writes this story`,
      kind: "warn",
    };
  }
  const name = effective();
  const card = cards.find((c) => c.id === name);
  if (notice?.name === name) return { text: `loading… ${notice.seconds} s`, kind: "busy" };
  if (card?.state === "loading") return { text: "loading…", kind: "busy" };
  if (card?.state === "unloading") return { text: "unloading…", kind: "busy" };
  if (card?.state === "failed") {
    return { text: `failed to load${card.error ? `: ${card.error}` : ""}`, kind: "warn" };
  }
  return { text: "", kind: "" };
}

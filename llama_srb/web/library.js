// The library: the writer's stories, the last opened first, with their length and when
// they were opened; open, rename, duplicate, delete (Undo brings it back), search by name,
// a new story, a story from a file. Stories come from the server; while it cannot be
// reached, from this browser's copies (cache.js), marked so.

import { ApiError, isOffline, stories } from "./api.js";
import * as Cache from "./cache.js";
import { $, el } from "./dom.js";
import * as Merge from "./merge.js";
import { fromServer } from "./sync.js";

let hooks = null; // {open(id), create(), importFile(file), apiKey()}
let listed = []; // what the list shows: {id, name, words, node_count, opened, pending}
let undoDelete = null; // the story last deleted, for Undo

export function init(given) {
  hooks = given;
  $("library-new").addEventListener("click", () => hooks.create());
  $("library-import").addEventListener("click", () => $("library-file").click());
  $("library-file").addEventListener("change", (event) => {
    const file = event.target.files[0];
    event.target.value = "";
    if (file) hooks.importFile(file);
  });
  $("library-search").addEventListener("input", draw);
  $("library-undo").addEventListener("click", restore);
}

/** Shows the library, fresh from the server (else from this browser). */
export async function show(message = "") {
  say(message);
  const copies = await Cache.allStories();
  // Copies with changes the server does not have yet (offline edits, say).
  const pending = new Set(
    copies.filter((c) => c.rev === null || !Merge.isEmpty(Merge.diff(c.synced, c.local)))
      .map((c) => c.id),
  );
  try {
    const served = await stories.list(hooks.apiKey());
    Cache.putMeta("library", served);
    const known = new Set(served.map((s) => s.id));
    // Made in this browser while the server was away, not saved there yet.
    const local = copies.filter((c) => c.rev === null && !known.has(c.id)).map(fromCopy);
    listed = [...local, ...served.map((s) => ({ ...s, pending: pending.has(s.id) }))];
    await saveMadeHere(local);
  } catch (err) {
    const keyed = err instanceof ApiError && err.status === 401;
    if (keyed) hooks.needKey(err.message);
    const served = (await Cache.getMeta("library")) ?? [];
    const known = new Set(served.map((s) => s.id));
    listed = [...copies.filter((c) => !known.has(c.id)).map(fromCopy), ...served];
    say(
      keyed
        ? "The server wants an API key: enter it at the top, and the library is read again."
        : isOffline(err)
          ? "The server cannot be reached: these are the stories this browser knows."
          : `The library could not be read: ${err.message}`,
    );
  }
  draw();
}

function fromCopy(copy) {
  const texts = [...copy.local.nodes.values()].map((n) => n.text);
  const current = copy.local.nodes.get(copy.local.current)?.text ?? texts[texts.length - 1] ?? "";
  return {
    id: copy.id,
    name: copy.name || "Untitled story",
    words: (current.match(/\S+/g) ?? []).length,
    node_count: copy.local.nodes.size,
    opened: new Date(copy.saved).toISOString(),
    pending: true,
  };
}

/** Stories made in this browser that the server does not have yet: made there now. */
async function saveMadeHere(local) {
  for (const story of local) {
    const copy = await Cache.getStory(story.id);
    const tree = copy.local;
    try {
      const made = await stories.create({
        id: copy.id, name: tree.name || undefined, current: tree.current, context: tree.context,
        settings: tree.settings, model: tree.model ?? undefined, nodes: [...tree.nodes.values()],
      }, hooks.apiKey());
      Object.assign(story, { pending: false, name: made.name, revision: made.revision });
      await Cache.putStory({ ...copy, rev: made.revision, synced: fromServer(made) });
    } catch (err) {
      if (err.code === "story_exists") continue; // opening it merges the two
      return;
    }
  }
}

function draw() {
  const words = $("library-search").value.trim().toLowerCase();
  const shown = listed.filter((s) => s.name.toLowerCase().includes(words));
  $("library-list").replaceChildren(...shown.map(item));
  $("library-empty").hidden = listed.length > 0;
  $("library-count").textContent = words
    ? `${shown.length} of ${listed.length} stories`
    : `${listed.length} ${listed.length === 1 ? "story" : "stories"}`;
}

function item(story) {
  const open = el("button", { type: "button", class: "story-open", "data-testid": "open-story" }, [
    el("span", { class: "story-name", "data-testid": "library-name", text: story.name }),
    el("span", { class: "story-meta", "data-testid": "story-meta", text: meta(story) }),
  ]);
  open.addEventListener("click", () => hooks.open(story.id));
  const rename = button("Rename", "rename-story", () => startRename(row, story));
  const copy = button("Duplicate", "duplicate-story", () => duplicate(story));
  const remove = button("Delete", "delete-story", () => deleteStory(story));
  const row = el("li", { class: "story-row", "data-testid": "library-story", "data-story-id": story.id }, [
    open,
    story.pending
      ? el("span", { class: "badge", "data-testid": "unsaved", text: story.revision ? "changes not saved yet" : "not on the server yet" })
      : "",
    el("span", { class: "story-actions" }, [rename, copy, remove]),
  ]);
  return row;
}

function button(label, testid, fn) {
  const b = el("button", { type: "button", class: "small", "data-testid": testid }, [label]);
  b.addEventListener("click", fn);
  return b;
}

function meta(story) {
  const parts = [`${(story.words ?? 0).toLocaleString()} words`, `${story.node_count ?? 0} nodes`];
  if (story.model) parts.push(story.model);
  if (story.opened) parts.push(`opened ${ago(new Date(story.opened))}`);
  return parts.join(" · ");
}

/** "just now", "5 min ago", "3 h ago", else the date. */
function ago(when) {
  const minutes = Math.round((Date.now() - when.getTime()) / 60_000);
  if (minutes < 1) return "just now";
  if (minutes < 60) return `${minutes} min ago`;
  if (minutes < 24 * 60) return `${Math.round(minutes / 60)} h ago`;
  return when.toLocaleDateString();
}

function startRename(row, story) {
  const input = el("input", {
    type: "text", class: "rename", "data-testid": "rename-input", maxlength: "200",
    "aria-label": "new name",
  });
  input.value = story.name;
  const name = row.querySelector(".story-name");
  name.replaceWith(input);
  input.focus();
  input.select();
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const value = input.value.trim();
    if (save && value && value !== story.name) await rename(story, value);
    draw();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    else if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
}

async function rename(story, name) {
  try {
    // The name is the last writer's: any revision the writer knows will do.
    await stories.write(story.id, { base_revision: Math.max(1, story.revision ?? 1), name }, hooks.apiKey());
    story.name = name;
    say(`Renamed to “${name}”.`);
  } catch (err) {
    say(`Could not rename it: ${err.message}`);
  }
}

async function duplicate(story) {
  try {
    const copy = await stories.duplicate(story.id, hooks.apiKey());
    await show(`“${copy.name}” is a copy of “${story.name}”.`);
  } catch (err) {
    say(`Could not duplicate it: ${err.message}`);
  }
}

async function deleteStory(story) {
  try {
    await stories.remove(story.id, hooks.apiKey());
  } catch (err) {
    return say(`Could not delete it: ${err.message}`);
  }
  undoDelete = story;
  listed = listed.filter((s) => s.id !== story.id);
  draw();
  say(`Deleted “${story.name}”.`, true);
}

async function restore() {
  const story = undoDelete;
  if (!story) return;
  undoDelete = null;
  try {
    await stories.restore(story.id, hooks.apiKey());
    await show(`“${story.name}” is back.`);
  } catch (err) {
    say(`Could not bring it back: ${err.message}`);
  }
}

function say(message, canUndo = false) {
  $("library-state").textContent = message;
  $("library-notice").hidden = message === "";
  $("library-undo").hidden = !canUndo;
}

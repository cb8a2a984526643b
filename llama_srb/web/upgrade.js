// On the first visits after the upgrade: the tree the page used to keep in this browser's
// local storage (one key, every story a root of it) becomes stories of the library, one
// per story, with the settings and the unsaved draft it had. Each story's id comes from
// its first node, so doing it again (the server was away, the page was closed halfway)
// makes nothing twice. The old key goes once the server holds them all; until then the
// stories it could not take wait in this browser's copies (cache.js).

import { isOffline, stories } from "./api.js";
import * as Cache from "./cache.js";
import { fromServer } from "./sync.js";
import * as Tree from "./tree.js";

const OLD_TREE = "llama-srb.tree";
const OLD_DRAFT = "llama-srb.draft";
const OLD_SETTINGS = "llama-srb.settings";

/** Moves the old tree into the library; resolves to {ids, refused}: its stories, and the
 * names of any the server refused (too large, say), which stay in the old key.
 * `draftKey(id)` names where a story's draft is kept. */
export async function upgrade(apiKey, draftKey) {
  const raw = localStorage.getItem(OLD_TREE);
  if (!raw) return { ids: [], refused: [] };
  let tree;
  try {
    tree = Tree.fromJSON(JSON.parse(raw), { allowNoCurrent: true });
  } catch {
    return { ids: [], refused: [] }; // unreadable: left where it is, as the old page did
  }
  const settings = readJSON(OLD_SETTINGS) ?? {};
  const draft = readJSON(OLD_DRAFT);
  const ids = [];
  const refused = [];
  let everyOnServer = true;
  for (const story of splitStories(tree)) {
    const first = Tree.childrenOf(story, null)[0];
    const id = `legacy-${hash(`${first.id}:${first.created}:${first.text}`)}`;
    story.settings = { ...settings };
    const copy = await Cache.getStory(id);
    const local = copy?.local ?? story; // edited here since: that copy
    try {
      const made = await stories.create({
        id, name: local.name, current: local.current, context: local.context,
        settings: local.settings, nodes: [...local.nodes.values()],
      }, apiKey);
      if (copy) await Cache.putStory({ ...copy, rev: made.revision, synced: fromServer(made) });
    } catch (err) {
      if (err.code !== "story_exists") {
        everyOnServer = false;
        if (!isOffline(err) && err.status !== 401) {
          refused.push(`${story.name}: ${err.message}`); // it stays in the old key
          continue;
        }
        if (!copy) {
          await Cache.putStory({
            id, name: story.name, rev: null, synced: null, local: story, history: null,
            saved: Date.now(),
          });
        }
      }
    }
    if (draft && story.nodes.has(draft.node)) localStorage.setItem(draftKey(id), JSON.stringify(draft));
    ids.push(id);
  }
  if (everyOnServer) {
    localStorage.removeItem(OLD_TREE);
    localStorage.removeItem(OLD_DRAFT);
  }
  return { ids, refused };
}

function hash(text) {
  let h1 = 0x811c9dc5;
  let h2 = 0x01000193;
  for (const ch of text) {
    const c = ch.codePointAt(0);
    h1 = Math.imul(h1 ^ c, 0x01000193) >>> 0;
    h2 = Math.imul(h2 ^ c, 0x5bd1e995) >>> 0;
  }
  return h1.toString(16).padStart(8, "0") + h2.toString(16).padStart(8, "0");
}

/** One tree per story: each root with what grew from it, and the retries of that root. */
export function splitStories(tree) {
  const roots = Tree.childrenOf(tree, null);
  const groups = new Map(); // first root's id → roots of that story
  for (const root of roots) {
    const same = roots.find((r) => r.id === root.retry_of || (r.text === root.text && r.id < root.id));
    const head = same ? [...groups.keys()].find((k) => groups.get(k).includes(same)) : undefined;
    if (head !== undefined) groups.get(head).push(root);
    else groups.set(root.id, [root]);
  }
  const kids = Tree.childIndex(tree);
  const made = [];
  for (const group of groups.values()) {
    const story = Tree.createTree({ name: Tree.nameFrom(group[0].text) || "Untitled story" });
    story.context = { ...tree.context };
    const stack = [...group];
    while (stack.length) {
      const node = stack.pop();
      story.nodes.set(node.id, Tree.cloneNode(node));
      stack.push(...(kids.get(node.id) ?? []));
    }
    story.current = story.nodes.has(tree.current) ? tree.current : group[0].id;
    Tree.bumpNextId(story);
    made.push(story);
  }
  // The story open last comes first in the library: it is made last, so opened last.
  return made.sort((a, b) => Number(a.nodes.has(tree.current)) - Number(b.nodes.has(tree.current)));
}

function readJSON(key) {
  try {
    return JSON.parse(localStorage.getItem(key) ?? "null");
  } catch {
    return null;
  }
}

// One open story kept in step with the server (docs/library.md). Every change is saved as
// it happens: a PATCH of what differs from the server's copy, on the revision last seen.
// The server merges it with what others wrote since and answers with their changes, which
// are merged into the writer's tree here (merge.js); what clashes is asked about. Every
// change is also kept in the browser (cache.js) at once, so a reload, a crash or a server
// that cannot be reached loses nothing: the page works from that copy and saves when the
// server is back. Other tabs of this browser hear of each save (BroadcastChannel); other
// devices' changes are fetched when the page is shown again and every POLL_MS.

import { isOffline, stories } from "./api.js";
import * as Cache from "./cache.js";
import * as History from "./history.js";
import * as Merge from "./merge.js";
import * as Tree from "./tree.js";

const SAVE_MS = 300; // changes within this much of each other go in one save
const CACHE_MS = 250;
const POLL_MS = 15_000;
const RETRY_MS = [1000, 2000, 4000, 8000, 15_000];
const EXIT_BYTES = 60_000; // under the 64 KiB browsers allow a keepalive request
const channel = "BroadcastChannel" in window ? new BroadcastChannel("llama-srb.stories") : null;

/**
 * The story `id`: its `tree` (the writer's, changed in place by merges) and undo `history`
 * are kept here and shown by the page. `hooks`: {apiKey(), onRenumber(moves), onMerged(),
 * ask(conflicts) → answer, onStatus(kind, message), onGone() → "restore" | "close",
 * needKey(message)}.
 */
export class StorySync {
  constructor(id, tree, history, hooks) {
    this.id = id;
    this.tree = tree;
    this.history = history ?? History.createHistory();
    this.history.pending = null;
    this.hooks = hooks;
    this.rev = null; // null: the server has no copy yet
    this.synced = null; // the server's copy at `rev`
    this.busy = false; // a save or fetch in flight, or a question open
    this.again = false; // a change came while busy
    this.timer = null;
    this.cacheTimer = null;
    this.failures = 0; // saves in a row that found the server unreachable
    this.waiting = false; // a retry is due: changes wait for it
    this.closed = false;
    this.behind = false; // another tab saved while this one was busy: catch up after
    this.keeping = null; // the write of this browser's copy in flight
    this.keepNext = null; // the write after it, for changes made meanwhile
    this.onBroadcast = (event) => {
      if (event.data?.story === this.id && event.data.revision > (this.rev ?? 0)) this.pull();
    };
    this.onVisible = () => {
      if (document.visibilityState === "visible") this.pull();
    };
    channel?.addEventListener("message", this.onBroadcast);
    document.addEventListener("visibilitychange", this.onVisible);
    window.addEventListener("online", this.onVisible);
    this.poller = setInterval(() => document.visibilityState === "visible" && this.pull(), POLL_MS);
  }

  /** Opens story `id`: the server's copy, with whatever this browser had not saved yet
   * merged in; else this browser's copy. */
  static async open(id, hooks) {
    const cached = await Cache.getStory(id);
    let story = null;
    try {
      story = await stories.get(id, hooks.apiKey());
    } catch (err) {
      const usable = cached && (isOffline(err) || err.status === 404);
      if (!usable) {
        if (isOffline(err)) {
          throw new Error("this story is not kept in this browser, and the server cannot be reached");
        }
        throw err; // 401, 404, 410 (in the trash): the caller says so
      }
    }
    // Undo's entries, unless the copy here lags behind the page that wrote them.
    const history = cached && freshHistory(id, cached.history) ? cached.history : null;
    if (!cached || (story && superseded(id, cached))) {
      // Nothing here, or this page saved (or handed over, as it went) more than its copy
      // here holds: the server's copy is the newer one; undo's entries still apply to it.
      const sync = new StorySync(id, fromServer(story), history, hooks);
      sync.adopt(story.revision, Tree.clone(sync.tree));
      if (cached?.local.nodes.has(cached.local.current)) sync.tree.current = cached.local.current;
      sync.keep();
      hooks.onStatus("saved", `Saved (revision ${story.revision}).`);
      return sync;
    }
    const sync = new StorySync(id, cached.local, history, hooks);
    sync.adopt(cached.rev, cached.synced);
    if (story) {
      // Merge what others saved since this browser's copy; a copy the server never had
      // (or a server that lost revisions) meets the whole story, from nothing.
      const known = cached.rev !== null && cached.rev <= story.revision && cached.synced;
      const base = known ? cached.synced : Tree.createTree();
      const changes = known
        ? await stories.since(id, cached.rev, hooks.apiKey())
        : Merge.asChanges(story);
      await sync.merge(base, changes);
      hooks.onStatus("saved", `Saved (revision ${sync.rev}).`);
    } else {
      sync.waiting = true; // the first save says whether the server is back
      hooks.onStatus("offline", "The server cannot be reached: working from this browser's copy.");
    }
    sync.flushSoon(0);
    return sync;
  }

  /** A new story, made here: the first save makes it on the server. */
  static create(id, tree, hooks) {
    const sync = new StorySync(id, tree, null, hooks);
    sync.keep();
    sync.flushSoon(0);
    return sync;
  }

  adopt(revision, synced) {
    this.rev = revision;
    this.synced = synced;
  }

  /** Call after every change: kept in this browser at once, saved to the server soon. */
  changed() {
    if (this.closed) return;
    this.cacheSoon();
    if (this.busy) this.again = true;
    else if (!this.waiting) this.flushSoon(SAVE_MS);
    this.coming();
  }

  /** A change is on its way (an edit is committed once typing pauses): not saved yet. */
  coming() {
    if (!this.closed && !this.waiting) this.hooks.onStatus("saving", "Saving…");
  }

  flushSoon(ms) {
    this.timer ??= setTimeout(() => this.flush(), ms);
  }

  /** Saves what differs from the server's copy now (or once a save in flight is done). */
  async flush() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.closed) return;
    if (this.busy) {
      this.again = true;
      return;
    }
    const tree = this.tree;
    const patch = Merge.diff(this.synced, tree);
    // This browser's copy first: it must never be older than what the server was sent
    // (IndexedDB keeps writes in order), or merging it again later would see clashes
    // with this page's own saves. "Saved" waits for it too: a reload right after it
    // finds undo's history here (a write still on its way when the page goes is lost).
    const kept = this.keep();
    if (this.rev !== null && Merge.isEmpty(patch)) {
      this.waiting = false;
      await kept;
      if (!this.busy && !this.pending()) this.hooks.onStatus("saved", `Saved (revision ${this.rev}).`);
      return;
    }
    this.busy = true;
    this.again = false;
    this.hooks.onStatus("saving", "Saving…");
    let ok = false;
    try {
      if (this.rev === null) await this.createOnServer(tree);
      else await this.write(tree, patch);
      ok = true;
      this.waiting = false;
      this.failures = 0;
      acknowledge(this.id, { rev: this.rev });
      await kept;
      if (!this.again && !this.pending()) this.hooks.onStatus("saved", `Saved (revision ${this.rev}).`);
      channel?.postMessage({ story: this.id, revision: this.rev });
    } catch (err) {
      await this.failed(err);
    } finally {
      this.busy = false;
      this.cacheSoon();
    }
    if (ok && !this.closed && (this.again || this.pending())) this.flushSoon(SAVE_MS);
    else if (this.behind) this.pull();
  }

  pending() {
    return this.rev === null || !Merge.isEmpty(Merge.diff(this.synced, this.tree));
  }

  async createOnServer(tree) {
    const draft = {
      id: this.id, name: tree.name || undefined, current: tree.current, context: tree.context,
      settings: tree.settings, model: tree.model ?? undefined, nodes: [...tree.nodes.values()],
    };
    try {
      const story = await stories.create(draft, this.hooks.apiKey());
      this.adopt(story.revision, fromServer(story)); // what changed meanwhile: the next save
    } catch (err) {
      // Made already (a create whose answer was lost): the two meet like any two copies.
      if (err.code !== "story_exists") throw err;
      const story = await stories.get(this.id, this.hooks.apiKey());
      await this.merge(Tree.createTree(), Merge.asChanges(story));
    }
  }

  async write(tree, patch) {
    const sent = Merge.applyPatch(Tree.clone(this.synced), patch);
    let answer;
    try {
      answer = await stories.write(this.id, { base_revision: this.rev, ...patch }, this.hooks.apiKey());
    } catch (err) {
      if (err.code !== "story_conflict") throw err;
      // Nothing was written: merge theirs in, ask about the clashes, then save again.
      await this.merge(this.synced, err.body.changes);
      this.again = true;
      return;
    }
    const moves = new Map(Object.entries(answer.renumbered).map(([a, b]) => [Number(a), b]));
    if (moves.size) {
      this.renumbered(Tree.renumber(tree, moves));
      Tree.renumber(sent, moves);
    }
    await this.merge(sent, answer.changes);
  }

  /** Merges the server's `changes` (made to `base`) into the writer's `tree` and adopts the
   * server's copy; asks about what clashes. Returns the nodes the writer's moved. */
  async merge(base, changes) {
    const { theirs, conflicts, moves, changed } = Merge.rebase(base, this.tree, changes);
    if (moves.size) this.renumbered(moves);
    this.adopt(changes.revision, theirs);
    if (conflicts.length) {
      const answer = await this.hooks.ask(conflicts);
      Merge.resolve(this.tree, base, theirs, conflicts, answer ?? "both");
    }
    if (changed) this.hooks.onMerged();
  }

  /** Nodes of the writer's tree have new ids: undo's entries and the page follow. */
  renumbered(moves) {
    History.renumber(this.history, moves);
    this.hooks.onRenumber(moves);
  }

  /** Others' changes since `rev`, merged in (another tab saved, or the page shows again). */
  async pull() {
    if (this.closed || this.rev === null) return;
    if (this.busy) {
      this.behind = true;
      return;
    }
    this.behind = false;
    this.busy = true;
    try {
      const changes = await stories.since(this.id, this.rev, this.hooks.apiKey());
      if (changes.revision !== this.rev) await this.merge(this.synced, changes);
    } catch (err) {
      if (!isOffline(err)) await this.failed(err);
    } finally {
      this.busy = false;
    }
    if (!this.waiting && (this.again || this.pending())) this.flushSoon(SAVE_MS);
  }

  /** A save that did not make it: offline, try again later (each change waits for that);
   * a key needed, ask; in the trash, ask; lost by the server, make it again. */
  async failed(err) {
    if (isOffline(err)) {
      this.retryIn(RETRY_MS[Math.min(this.failures++, RETRY_MS.length - 1)]);
      this.hooks.onStatus(
        "offline",
        "The server cannot be reached: your changes are kept in this browser and saved when it is back.",
      );
    } else if (err.status === 401) {
      this.waiting = true; // until the key is given (retry)
      this.hooks.needKey(err.message);
      this.hooks.onStatus("error", "Not saved: the server wants an API key (at the top).");
    } else if (err.status === 410) {
      if ((await this.hooks.onGone()) === "restore") {
        await stories.restore(this.id, this.hooks.apiKey()).catch(() => null);
        this.retryIn(0);
      } else {
        this.waiting = true;
      }
    } else if (err.status === 404) {
      // The server lost it (a new data folder, say): this browser's copy makes it again.
      this.adopt(null, null);
      this.retryIn(0);
    } else {
      this.hooks.onStatus("error", `Not saved: ${err.message}. Your changes are kept in this browser.`);
    }
  }

  retryIn(ms) {
    this.waiting = true;
    setTimeout(() => {
      if (this.closed) return;
      this.waiting = false;
      this.flush();
    }, ms);
  }

  /** After the API key changed, or the server answered again: save at once. */
  retry() {
    this.failures = 0;
    this.waiting = false;
    this.flushSoon(0);
  }

  /** The page is going: what is not saved yet goes in one last request the browser
   * finishes alone (a keepalive fetch, so at most 64 KiB), and into this browser's copy. */
  leave() {
    this.keep(); // may not finish: a page that goes aborts its IndexedDB writes
    if (this.closed || this.rev === null || this.waiting) return; // offline: the copy here
    const patch = Merge.diff(this.synced, this.tree);
    if (Merge.isEmpty(patch)) return;
    const body = { base_revision: this.rev, ...patch };
    if (JSON.stringify(body).length > EXIT_BYTES) return; // the copy here keeps it
    stories.writeOnExit(this.id, body, this.hooks.apiKey()).catch(() => {});
    acknowledge(this.id, { rev: this.rev, exit: true });
  }

  cacheSoon() {
    clearTimeout(this.cacheTimer);
    this.cacheTimer = setTimeout(() => this.keep(), CACHE_MS);
  }

  /** This browser's copy, now (also on pagehide); resolves once a write that holds the
   * story as it is now is done. One write at a time: a change made while one is written
   * is kept by the next, so writes never queue up behind each other (a page that goes
   * aborts the ones still waiting). */
  keep() {
    clearTimeout(this.cacheTimer);
    if (this.keeping) {
      this.keepNext ??= this.keeping.then(() => {
        this.keepNext = null;
        return this.keep();
      });
      return this.keepNext;
    }
    const tree = this.tree;
    const record = {
      id: this.id,
      name: tree.name,
      rev: this.rev,
      synced: this.synced,
      local: tree,
      history: historyOf(this.history),
      saved: Date.now(),
    };
    remember(historyKey(this.id), History.fingerprint(this.history));
    this.keeping = Cache.putStory(record)
      .catch((err) => {
        console.error("llama-srb: this browser's copy of the story was not kept", err);
        this.hooks.onStatus("error", "This browser could not keep a copy (its storage is full?).");
      })
      .finally(() => {
        this.keeping = null;
      });
    return this.keeping;
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    clearInterval(this.poller);
    channel?.removeEventListener("message", this.onBroadcast);
    document.removeEventListener("visibilitychange", this.onVisible);
    window.removeEventListener("online", this.onVisible);
  }
}

// What this browser last handed the server for a story (local storage, written at once,
// unlike IndexedDB): a save it confirmed, or the last one sent as the page went. A copy in
// IndexedDB older than that holds nothing the server lacks: its unsaved changes were sent
// since (and maybe changed again), so merging them again would clash with the page's own.
function ackKey(id) {
  return `llama-srb.acked.${id}`;
}

function acknowledge(id, ack) {
  remember(ackKey(id), JSON.stringify(ack));
}

function historyKey(id) {
  return `llama-srb.history.${id}`;
}

/** Whether undo's entries in the copy here are the last ones the page kept. */
function freshHistory(id, history) {
  return Boolean(history) && localStorage.getItem(historyKey(id)) === History.fingerprint(history);
}

function remember(key, value) {
  try {
    localStorage.setItem(key, value);
  } catch {
    // full: the copy in IndexedDB is used as it is
  }
}

function superseded(id, cached) {
  if (cached.rev === null) return false;
  try {
    const ack = JSON.parse(localStorage.getItem(ackKey(id)) ?? "null");
    return Boolean(ack && (ack.exit ? ack.rev >= cached.rev : ack.rev > cached.rev));
  } catch {
    return false;
  }
}

/** Undo's entries, without the snapshot of a change still being made. */
function historyOf(history) {
  return { past: history.past, future: history.future, pending: null };
}

/** A tree from the server's story. */
export function fromServer(story) {
  const tree = Tree.fromJSON(
    {
      format: Tree.FORMAT, name: story.name, current: story.current, context: story.context,
      settings: story.settings, nodes: story.nodes, next_id: story.next_id,
    },
    { allowNoCurrent: true },
  );
  tree.name = story.name;
  tree.model = story.model ?? null;
  return tree;
}

// The browser's copy of each story this page opened, in IndexedDB: the server's copy as
// last seen (`synced`, at revision `rev`), the writer's (`local`) and the undo history. It
// is what the page works from while the server cannot be reached, and what it still has
// to save; the server's list of stories is kept too, for the library offline.

const NAME = "llama-srb";
const VERSION = 1;

let opened = null;

function database() {
  opened ??= new Promise((resolve, reject) => {
    const request = indexedDB.open(NAME, VERSION);
    request.onupgradeneeded = () => {
      request.result.createObjectStore("stories", { keyPath: "id" });
      request.result.createObjectStore("meta");
    };
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  return opened;
}

/** Runs `work(store)` in a transaction; resolves to the last request's result once it is
 * written (or to `fallback` when this browser keeps nothing: a private window, say). */
async function run(storeName, mode, work, fallback = null) {
  let db;
  try {
    db = await database();
  } catch {
    return fallback;
  }
  return new Promise((resolve, reject) => {
    const tx = db.transaction(storeName, mode);
    const request = work(tx.objectStore(storeName));
    tx.oncomplete = () => resolve(request?.result ?? fallback);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

export function getStory(id) {
  return run("stories", "readonly", (s) => s.get(id));
}

/** `record`: {id, name, rev, synced, local, history, saved}. */
export function putStory(record) {
  return run("stories", "readwrite", (s) => s.put(record));
}

export function deleteStory(id) {
  return run("stories", "readwrite", (s) => s.delete(id));
}

export function allStories() {
  return run("stories", "readonly", (s) => s.getAll(), []);
}

export function getMeta(key) {
  return run("meta", "readonly", (s) => s.get(key));
}

export function putMeta(key, value) {
  return run("meta", "readwrite", (s) => s.put(value, key));
}

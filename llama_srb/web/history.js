// Undo and redo over whole-tree snapshots (Tree.clone copies): every change to the tree
// records the tree as it was just before. Kept in memory only; the last LIMIT changes.

const LIMIT = 100;

export function createHistory() {
  return { past: [], future: [] };
}

/** Call before changing the tree; returns the entry, for `forget`. */
export function record(history, snapshot) {
  history.past.push(snapshot);
  if (history.past.length > LIMIT) history.past.shift();
  history.future = [];
  return snapshot;
}

/** Drops `entry` again if it is the latest (a change that did not happen after all). */
export function forget(history, entry) {
  if (history.past[history.past.length - 1] === entry) history.past.pop();
}

/** The snapshot to restore, given the present one; null if there is nothing to undo. */
export function undo(history, present) {
  if (history.past.length === 0) return null;
  history.future.push(present);
  return history.past.pop();
}

export function redo(history, present) {
  if (history.future.length === 0) return null;
  history.past.push(present);
  return history.future.pop();
}

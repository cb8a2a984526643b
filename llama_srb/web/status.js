// The status line under the buttons (what is happening now, or what went wrong) and the
// notice below it (what the page did with the writer's words: kept, deleted, imported).

import { $ } from "./dom.js";

/** `kind`: "" (news), "error", or "key" (the server wants an API key). */
export function setStatus(message, kind = "") {
  $("status").textContent = message;
  $("status").dataset.kind = kind;
}

export function statusKind() {
  return $("status").dataset.kind;
}

export function setNotice(message) {
  $("notice").textContent = message;
  $("notice").hidden = message === "";
}

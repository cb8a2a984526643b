// The server as the top bar shows it: the model's name, and the API key field, which comes
// forward (at the top, with the focus) when the server asks for a key and is checked as
// the writer types it.

import { ApiError, fetchModelName } from "./api.js";
import { $, debounce, isTyping } from "./dom.js";
import { setStatus, statusKind } from "./status.js";

const API_KEY_KEY = "llama-srb.api-key";

let latest = 0; // only the answer to the latest check counts

/** `onModel(name)` hears the model's name ("" while unknown); `onKey()`, that the writer
 * changed the API key. */
export function init(onModel, onKey = () => {}) {
  $("api-key").value = localStorage.getItem(API_KEY_KEY) ?? "";
  showKeyBox(apiKey() !== "");
  $("key-toggle").addEventListener("click", () => {
    showKeyBox($("key-box").hidden);
    if (!$("key-box").hidden) $("api-key").focus();
  });
  $("api-key").addEventListener(
    "input",
    debounce(() => {
      localStorage.setItem(API_KEY_KEY, apiKey());
      check(onModel);
      onKey();
    }, 250),
  );
  check(onModel);
}

export function apiKey() {
  return $("api-key").value.trim();
}

async function check(onModel) {
  const label = $("model-name");
  const request = ++latest;
  try {
    const name = await fetchModelName(apiKey());
    if (request !== latest) return;
    label.textContent = name;
    label.classList.remove("error");
    $("key-box").classList.remove("needed");
    if (statusKind() === "key") setStatus("");
    onModel(name);
  } catch (err) {
    if (request !== latest) return;
    onModel("");
    if (err instanceof ApiError && err.status === 401) return needKey(err.message);
    label.textContent = err instanceof ApiError ? err.message : "server unreachable";
    label.classList.add("error");
  }
}

/** The server wants a key: the field is shown at the top, next to the model, with focus. */
export function needKey(message) {
  const label = $("model-name");
  label.textContent = apiKey() ? "wrong API key" : "API key needed";
  label.classList.add("error");
  showKeyBox(true);
  $("key-box").classList.add("needed");
  if (!isTyping(document.activeElement)) $("api-key").focus();
  setStatus(`${message}: enter the server's API key at the top of the page.`, "key");
}

function showKeyBox(shown) {
  $("key-box").hidden = !shown;
  $("key-toggle").setAttribute("aria-expanded", String(shown));
}

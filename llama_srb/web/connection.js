// The server as the top bar shows it: its models (shown by models.js), and the API key
// field, which comes forward (at the top, with the focus) when the server asks for a key
// and is checked as the writer types it.

import { ApiError, fetchModels } from "./api.js";
import { $, debounce, isTyping } from "./dom.js";
import { setStatus, statusKind } from "./status.js";

const API_KEY_KEY = "llama-srb.api-key";

let latest = 0; // only the answer to the latest check counts

/** `onModels(cards)` hears the server's models (null while unknown: the label at the top
 * says why); `onKey()`, that the writer changed the API key. */
export function init(onModels, onKey = () => {}) {
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
      check(onModels);
      onKey();
    }, 250),
  );
  check(onModels);
}

export function apiKey() {
  return $("api-key").value.trim();
}

async function check(onModels) {
  const label = $("model-name");
  const request = ++latest;
  try {
    const cards = await fetchModels(apiKey());
    if (request !== latest) return;
    label.classList.remove("error");
    $("key-box").classList.remove("needed");
    if (statusKind() === "key") setStatus("");
    onModels(cards);
  } catch (err) {
    if (request !== latest) return;
    onModels(null);
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

// While the model reads a long prompt (the server's prompt_progress events: total, cache,
// processed, time_ms), the page says how far it is and about how long is left, beside the
// cards: for a generation, and for the warm-up that reads a story into the prefix cache
// when it opens, so the first branch after that starts at once.

import { $ } from "./dom.js";

let reading = null; // {kind, first: {processed, time_ms}} while a prompt is read

const WHAT = {
  generate: "Reading the story",
  warm: "Reading the story into the model's cache",
};

/** A prompt is sent (`kind`: "generate" or "warm"). */
export function start(kind) {
  hide();
  reading = { kind, first: null };
  $("reading").dataset.kind = kind;
}

/** One prompt_progress event. */
export function update(progress) {
  if (!reading) return;
  const { total, cache, processed, time_ms: ms } = progress;
  reading.first ??= { processed: cache, time_ms: 0 };
  if (processed >= total) return finish(cache >= total - 1);
  const box = $("reading");
  box.hidden = false;
  $("reading-bar").max = total;
  $("reading-bar").value = processed;
  const done = processed - reading.first.processed;
  const rate = ms > reading.first.time_ms ? done / (ms - reading.first.time_ms) : 0;
  const left = rate > 0 ? Math.ceil((total - processed) / rate / 1000) : null;
  const n = (x) => x.toLocaleString();
  const cached = cache ? `, ${n(cache)} of them from the cache` : "";
  const eta = left === null ? "" : `, about ${left} s left`;
  $("reading-text").textContent =
    `${WHAT[reading.kind]}: ${n(processed)} of ${n(total)} tokens${cached}${eta}`;
}

/** The prompt is read (or the request ended): a warm-up says so, a generation goes on. */
export function finish(wasCached = false) {
  if (!reading) return;
  const box = $("reading");
  if (reading.kind === "warm") {
    box.hidden = false;
    $("reading-bar").value = $("reading-bar").max;
    $("reading-text").textContent = wasCached
      ? "The story is in the model's cache: continuations start at once."
      : "Read: the story is in the model's cache, continuations start at once.";
    box.dataset.done = "true";
  } else {
    box.hidden = true;
  }
  reading = null;
}

export function hide() {
  reading = null;
  $("reading").hidden = true;
  $("reading").dataset.done = "false";
}

// Live branching in a streaming card: Fork (more continuations of it, from the caret the
// writer placed in its text, else from its end), Drop (and Drop & refill), and the writer's
// words typed into it. A streaming card's text is the stream's alone: what the writer types
// waits in a line at the card's end and is sent (Enter, or a pause in typing) to be written
// into the branch; the server sends it back on the stream, so it shows once, where the
// model took it. Words not sent before the card ends become the writer's edit of it.

const PAUSE_MS = 2000; // a pause in typing sends the words (not one mid-word, mostly)

// choice → {words, caret, timer, sending, input}: what the writer did to a card outlives
// a redraw of the cards (a fork's new node redraws them while they stream).
const held = new WeakMap();

function heldOf(choice) {
  if (!held.has(choice)) {
    held.set(choice, { words: "", caret: null, timer: null, sending: Promise.resolve() });
  }
  return held.get(choice);
}

/** Wires the live controls of `card`, choice `index`. `handlers`: fork(index, caret),
 * drop(index, refill), steer(index, words) → a promise, keep(index, words). */
export function wire(card, choice, index, handlers) {
  const h = heldOf(choice);
  const text = card.querySelector(".choice-text");
  const wordBox = card.querySelector(".choice-words");
  const steer = card.querySelector(".steer-words");
  const isLive = () => card.dataset.live === "1";
  h.input = steer;
  steer.value = h.words;

  // The fork point: a caret placed before the end (at the end: the end as it then stands).
  const remember = () => {
    if (!isLive()) return;
    h.caret = text.selectionStart < text.value.length
      ? { start: text.selectionStart, end: text.selectionEnd }
      : null;
    label(card, h);
  };
  for (const kind of ["pointerup", "keyup", "select"]) text.addEventListener(kind, remember);

  const on = (name, fn) => card.querySelector(name).addEventListener("click", fn);
  on(".fork", () => handlers.fork(index, h.caret?.start ?? null));
  on(".drop", (event) => handlers.drop(index, event.shiftKey)); // Shift: and refill
  on(".refill", () => handlers.drop(index, true));

  // Typing into the streaming text goes to the line at its end, where the words will go.
  card.addEventListener("keydown", (event) => {
    if (!isLive() || (event.target !== text && event.target !== wordBox)) return;
    const typed = event.key.length === 1 && !event.ctrlKey && !event.metaKey && !event.altKey;
    if (!typed || event.isComposing) return;
    event.preventDefault();
    type(steer, event.key);
  });
  text.addEventListener("paste", (event) => {
    if (!isLive()) return;
    event.preventDefault();
    type(steer, event.clipboardData.getData("text/plain"));
  });
  steer.addEventListener("input", () => {
    h.words = steer.value;
    clearTimeout(h.timer);
    if (h.words) h.timer = setTimeout(() => send(choice, index, handlers), PAUSE_MS);
  });
  steer.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      send(choice, index, handlers);
    } else if (event.key === "Escape" && steer.value) {
      // Esc takes the words back (not the whole generation, as it does elsewhere).
      event.preventDefault();
      event.stopPropagation();
      steer.value = "";
      steer.dispatchEvent(new Event("input"));
    }
  });
}

/** Shows or hides the live controls (`live`: the card streams, and its call can be acted
 * on); call after the card's text is set, which moves the caret: it is put back. */
export function show(card, choice, live) {
  const h = heldOf(choice);
  card.dataset.live = live ? "1" : "";
  for (const name of [".fork", ".drop", ".refill", ".steer"]) {
    card.querySelector(name).hidden = !live;
  }
  card.querySelector(".use").hidden = live;
  const text = card.querySelector(".choice-text");
  if (live && h.caret && text.selectionStart !== h.caret.start) {
    text.setSelectionRange(h.caret.start, h.caret.end);
  }
  label(card, h);
}

/** A card that ended: words typed and not sent go into its text, as the writer's edit. */
export function settle(choice, index, handlers) {
  const h = held.get(choice);
  if (!h) return;
  h.caret = null;
  clearTimeout(h.timer);
  if (!h.words) return;
  const words = h.words;
  h.words = "";
  if (h.input) h.input.value = "";
  handlers.keep(index, joined(choice.text, words));
}

/** A fork point as the server counts it: characters (code points), not UTF-16 units. */
export function codePoints(text) {
  return [...text].length;
}

/** The writer's words after `text`: a space between when both sides are letters or digits
 * (the writer types words, the stream ended wherever a token did). */
export function joined(text, words) {
  return /[\p{L}\p{N}]$/u.test(text) && /^[\p{L}\p{N}]/u.test(words) ? ` ${words}` : words;
}

function send(choice, index, handlers) {
  const h = heldOf(choice);
  clearTimeout(h.timer);
  const words = h.words;
  if (!words) return;
  h.words = "";
  h.input.value = "";
  // One at a time, in order: the words go into the branch in the order they were typed.
  h.sending = h.sending
    .then(() => handlers.steer(index, joined(choice.text, words)))
    .catch(() => {
      h.words = words + h.words; // back in the line, to send again (or kept, once it ends)
      h.input.value = h.words;
      if (choice.finish_reason !== null) settle(choice, index, handlers);
    });
}

function type(input, text) {
  input.focus();
  input.setRangeText(text, input.value.length, input.value.length, "end");
  input.dispatchEvent(new Event("input"));
}

function label(card, h) {
  const fork = card.querySelector(".fork");
  fork.textContent = h.caret ? "Fork here" : "Fork";
  fork.title = h.caret
    ? "More continuations of this one from the caret (n from the settings)"
    : "More continuations of this one from where it is now (n from the settings)";
}

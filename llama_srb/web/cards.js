// The continuation cards of the shown node: side by side in balanced rows (4 cards: 2 + 2,
// not 3 + 1), each an editable text, or with logprobs its words (words.js) until edited.
// A streaming card has the live controls (live.js): fork, drop, and the writer's words.

import { $, el } from "./dom.js";
import * as Live from "./live.js";
import * as Words from "./words.js";

const MIN_CARD_PX = 240;
const GAP_PX = 14;

let cards = []; // the shown cards, by choice index
let drawn = { node: null, options: null }; // what they show, and how (render's arguments)

/** Draws the cards of `node`. `handlers`: accept(index), edit(index, text), and the live
 * ones (live.js): fork, drop, steer, keep. `branched(index)` counts the nodes grown from a
 * card; `isStreaming(choice)` says whether it is still coming; `isLive(choice)` whether its
 * call can be acted on (forked, dropped, steered) now. */
export function render(node, options) {
  const box = $("choices");
  // Drawn again while the writer is in a card (a fork's node appeared): the focus stays.
  const focus = node === drawn.node ? focused() : null;
  box.replaceChildren();
  cards = [];
  drawn = { node, options };
  if (!node || node.choices.length === 0) {
    box.append(el("p", { class: "empty", text: "No continuations yet: press Generate." }));
    balance();
    return;
  }
  node.choices.forEach((choice, index) => {
    const card = cardFor(choice, index, options.handlers);
    const count = options.branched(index);
    if (count) card.querySelector(".branched").textContent = `branched ${count}×`;
    cards.push(card);
    box.append(card);
    update(index, choice);
  });
  balance();
  if (focus) refocus(focus);
}

/** Whether choice `index` has its card (a refill's new choice needs a new drawing). */
export function has(index) {
  return cards[index] !== undefined;
}

/** Patches one card as tokens arrive. */
export function update(index, choice) {
  const card = cards[index];
  if (!card) return;
  const { isStreaming, isLive, handlers } = drawn.options;
  const streaming = isStreaming(choice);
  if (!streaming) Live.settle(choice, index, handlers);
  const text = card.querySelector(".choice-text");
  if (text.value !== choice.text) text.value = choice.text;
  text.readOnly = streaming;
  text.placeholder = streaming ? "The first words are on their way…" : "";
  const words = card.querySelector(".choice-words");
  // Words once they come (a server that sends no logprobs leaves the plain text).
  const wordMode =
    choice.pieces?.length > 0 && !choice.edited && card.dataset.editing !== "1";
  words.hidden = !wordMode;
  text.hidden = wordMode;
  card.querySelector(".edit").hidden = !wordMode || streaming;
  if (wordMode) {
    const shown = words.childElementCount;
    if (shown > choice.pieces.length) words.replaceChildren();
    Words.appendWords(words, choice.pieces, words.childElementCount);
  }
  card.dataset.finished = String(choice.finish_reason !== null);
  card.dataset.reason = choice.finish_reason ?? "";
  const finish = card.querySelector(".finish");
  finish.textContent = choice.finish_reason ?? (streaming ? "streaming…" : "–");
  finish.dataset.reason = choice.finish_reason ?? "";
  card.querySelector(".tokens").textContent = `${choice.tokens} tok`;
  // An empty card has nothing to use; a streaming one is not finished.
  card.querySelector(".use").disabled = streaming || choice.text === "";
  card.querySelector(".edited").hidden = !choice.edited;
  Live.show(card, choice, streaming && isLive(choice));
}

/** The card index holding `element`, or null. */
export function indexOf(element) {
  const card = element?.closest?.(".choice");
  return card ? Number(card.dataset.index) : null;
}

function cardFor(choice, index, handlers) {
  const card = $("choice-template").content.firstElementChild.cloneNode(true);
  const text = card.querySelector(".choice-text");
  card.dataset.index = String(index);
  card.querySelector(".choice-index").textContent = `#${index + 1}`;
  text.setAttribute("aria-label", `continuation ${index + 1}`);
  card.querySelector(".choice-words").setAttribute("aria-label", `continuation ${index + 1}`);
  text.addEventListener("input", () => {
    handlers.edit(index, text.value);
    card.querySelector(".edited").hidden = false;
  });
  card.querySelector(".use").addEventListener("click", () => handlers.accept(index));
  card.querySelector(".edit").addEventListener("click", () => {
    card.dataset.editing = "1";
    update(index, choice);
    text.focus();
  });
  Live.wire(card, choice, index, handlers);
  return card;
}

/** Where the focus is in the cards' text boxes: which card and box, and its selection. */
function focused() {
  const active = document.activeElement;
  const index = indexOf(active);
  const part = [".choice-text", ".steer-words"].find((p) => active?.matches(p));
  if (index === null || !part) return null;
  return { index, part, start: active.selectionStart, end: active.selectionEnd };
}

function refocus({ index, part, start, end }) {
  const target = cards[index]?.querySelector(part);
  if (!target || target.hidden) return;
  target.focus({ preventScroll: true });
  target.setSelectionRange(start, end);
}

/** Columns that fill the rows evenly: as many as fit, then as few as keep the rows count. */
export function balance() {
  const box = $("choices");
  const n = cards.length;
  if (n === 0) {
    box.style.gridTemplateColumns = "";
    return;
  }
  const fit = Math.max(1, Math.floor((box.clientWidth + GAP_PX) / (MIN_CARD_PX + GAP_PX)));
  const rows = Math.ceil(n / Math.min(n, fit));
  const columns = Math.ceil(n / rows);
  box.style.gridTemplateColumns = `repeat(${columns}, minmax(0, 1fr))`;
}

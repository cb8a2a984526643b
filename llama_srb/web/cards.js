// The continuation cards of the shown node: side by side in balanced rows (4 cards: 2 + 2,
// not 3 + 1), each an editable text, or with logprobs its words (words.js) until edited.

import { $, el } from "./dom.js";
import * as Words from "./words.js";

const MIN_CARD_PX = 240;
const GAP_PX = 14;

let cards = []; // the shown cards, by choice index

/** Draws the cards of `node`. `handlers`: accept(index), edit(index, text). `branched(index)`
 * counts the nodes grown from a card; `isStreaming(choice)` says whether it is still coming. */
export function render(node, { handlers, branched, isStreaming }) {
  const box = $("choices");
  box.replaceChildren();
  cards = [];
  if (!node || node.choices.length === 0) {
    box.append(el("p", { class: "empty", text: "No continuations yet: press Generate." }));
    balance();
    return;
  }
  node.choices.forEach((choice, index) => {
    const card = cardFor(choice, index, handlers);
    const count = branched(index);
    if (count) card.querySelector(".branched").textContent = `branched ${count}×`;
    cards.push(card);
    box.append(card);
    update(index, choice, isStreaming(choice));
  });
  balance();
}

/** Patches one card as tokens arrive. */
export function update(index, choice, streaming) {
  const card = cards[index];
  if (!card) return;
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
  const finish = card.querySelector(".finish");
  finish.textContent = choice.finish_reason ?? (streaming ? "streaming…" : "–");
  finish.dataset.reason = choice.finish_reason ?? "";
  card.querySelector(".tokens").textContent = `${choice.tokens} tok`;
  // An empty card has nothing to use; a streaming one is not finished.
  card.querySelector(".use").disabled = streaming || choice.text === "";
  card.querySelector(".edited").hidden = !choice.edited;
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
    update(index, choice, false);
    text.focus();
  });
  return card;
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

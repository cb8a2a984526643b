// Branching at the word: with logprobs on, a continuation is shown token by token; hovering
// a token shows its probability and the alternatives the model weighed, clicking it pins a
// menu to regenerate from there, take the card up to there, or continue with an alternative.

import { $, el } from "./dom.js";

/** The pieces of one streamed chunk's `logprobs`: [{t: text, lp: logprob, top: [[t, lp]]}]. */
export function piecesOf(logprobs) {
  const tokens = logprobs?.tokens ?? [];
  return tokens.map((t, i) => ({
    t,
    lp: round(logprobs.token_logprobs?.[i]),
    top: Object.entries(logprobs.top_logprobs?.[i] ?? {}).map(([alt, lp]) => [alt, round(lp)]),
  }));
}

/** Pieces trimmed to what the text holds (a stop string's tokens are not in the text). */
export function align(pieces, text) {
  let at = 0;
  const kept = [];
  for (const piece of pieces) {
    if (!text.startsWith(piece.t, at)) break;
    kept.push(piece);
    at += piece.t.length;
  }
  return at === text.length ? kept : null;
}

/** Appends spans for `pieces[from:]` to `box`. */
export function appendWords(box, pieces, from) {
  for (let i = from; i < pieces.length; i++) {
    const piece = pieces[i];
    const p = probability(piece.lp);
    box.append(
      el("span", {
        class: "word",
        tabindex: "-1",
        "data-testid": "word",
        "data-i": String(i),
        "data-band": p === null ? "" : p >= 0.5 ? "high" : p >= 0.1 ? "mid" : "low",
      }, [piece.t]),
    );
  }
}

/** Text of the pieces before index `i`. */
export function textBefore(pieces, i) {
  return pieces.slice(0, i).map((p) => p.t).join("");
}

// ---------- the menu ----------

let pinned = null; // {span} while the menu is pinned to a word

/** Wires hover and click on the words inside `root`; `lookup(span)` gives
 * `{piece, actions: {regenerate, useUpTo, alternative(text)}}` for a word. */
export function init(root, lookup) {
  root.addEventListener("mouseover", (event) => {
    const span = event.target.closest?.(".word");
    if (span && !pinned) show(span, lookup(span), false);
  });
  root.addEventListener("mouseout", (event) => {
    if (event.target.closest?.(".word") && !pinned) hide();
  });
  root.addEventListener("click", (event) => {
    const span = event.target.closest?.(".word");
    if (!span) return;
    show(span, lookup(span), true);
    $("word-menu").querySelector(".wm-actions button")?.focus();
  });
  // The keyboard: in a card's words, ← and → move from word to word, Enter opens the menu.
  root.addEventListener("keydown", (event) => {
    const box = event.target.closest?.(".choice-words");
    if (!box || event.ctrlKey || event.metaKey || event.altKey) return;
    const words = [...box.querySelectorAll(".word")];
    const at = words.indexOf(event.target);
    if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
      event.preventDefault();
      const step = event.key === "ArrowRight" ? 1 : -1;
      const next = words[at < 0 ? 0 : Math.min(words.length - 1, Math.max(0, at + step))];
      next?.focus();
      if (next) show(next, lookup(next), false);
    } else if ((event.key === "Enter" || event.key === " ") && at >= 0) {
      event.preventDefault();
      show(words[at], lookup(words[at]), true);
      $("word-menu").querySelector(".wm-actions button")?.focus();
    }
  });
  document.addEventListener("pointerdown", (event) => {
    if (pinned && !event.target.closest("#word-menu, .word")) hide();
  });
}

export function isOpen() {
  return pinned !== null;
}

export function hide() {
  const span = pinned?.span;
  const menu = $("word-menu");
  const hadFocus = menu.contains(document.activeElement);
  pinned = null;
  menu.hidden = true;
  if (!span) return;
  span.classList.remove("picked");
  // Back to the word, for the keyboard (unless what was picked redrew the cards).
  if (hadFocus && span.isConnected) span.focus();
}

function show(span, { piece, actions }, pin) {
  const menu = $("word-menu");
  if (pinned) pinned.span.classList.remove("picked");
  pinned = pin ? { span } : null;
  span.classList.toggle("picked", pin);
  menu.classList.toggle("pinned", pin);
  menu.replaceChildren(...menuContent(piece, actions, pin));
  menu.hidden = false;
  place(menu, span);
}

function menuContent(piece, actions, pin) {
  const act = (fn) => () => {
    hide();
    fn();
  };
  const head = el("p", { class: "wm-head" }, [
    el("q", { text: visible(piece.t) }),
    " ",
    el("span", { "data-testid": "word-probability", text: percent(piece.lp) }),
  ]);
  const alts = piece.top
    .filter(([t]) => t !== piece.t)
    .map(([t, lp]) => {
      const button = el("button", {
        type: "button", "data-testid": "alternative", tabindex: pin ? null : "-1",
        title: "continue with this word instead",
      }, [el("q", { text: visible(t) })]);
      button.addEventListener("click", act(() => actions.alternative(t)));
      return el("li", {}, [button, el("span", { class: "wm-p", text: percent(lp) })]);
    });
  const regenerate = el("button", { type: "button", "data-testid": "regenerate-here" }, [
    "Regenerate from here",
  ]);
  const useUpTo = el("button", { type: "button", "data-testid": "use-to-here" }, [
    "Use up to here",
  ]);
  regenerate.addEventListener("click", act(actions.regenerate));
  useUpTo.addEventListener("click", act(actions.useUpTo));
  const parts = [head];
  if (alts.length) parts.push(el("p", { class: "wm-label", text: "Alternatives" }), el("ol", {}, alts));
  if (pin) parts.push(el("div", { class: "wm-actions" }, [regenerate, useUpTo]));
  else parts.push(el("p", { class: "wm-label", text: "Click the word to branch here." }));
  return parts;
}

function place(menu, span) {
  const r = span.getBoundingClientRect();
  const width = menu.offsetWidth;
  const left = Math.min(Math.max(8, r.left), window.innerWidth - width - 8);
  menu.style.left = `${left + window.scrollX}px`;
  menu.style.top = `${r.bottom + window.scrollY + 6}px`;
}

function probability(lp) {
  return typeof lp === "number" ? Math.exp(lp) : null;
}

function percent(lp) {
  const p = probability(lp);
  if (p === null) return "";
  return p >= 0.995 ? "100%" : p >= 0.1 ? `${(p * 100).toFixed(0)}%` : `${(p * 100).toFixed(1)}%`;
}

function round(lp) {
  return typeof lp === "number" ? Math.round(lp * 1e4) / 1e4 : null;
}

/** A token as the writer can see it: spaces and newlines shown. */
function visible(t) {
  return t.replaceAll("\n", "↵").replace(/^ /, "␣");
}

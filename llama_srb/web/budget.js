// The story against the model's context: how many tokens the prompt takes (counted by the
// server's /v1/tokenize), how many the continuations may take (n × max tokens, which the
// server reserves up front), and, when they do not fit, how much of the story's start is
// left out of the prompt so they do. Memory and the author's note always stay in.
//
// The cut moves in steps of a quarter of the context and lands on a paragraph (else a
// sentence) boundary, so that as the story grows the prompt keeps the same start for a
// while and the server's prefix cache keeps serving it.

import { countTokens } from "./api.js";
import { $, debounce } from "./dom.js";
import { buildPrompt } from "./prompt.js";

const STEP = 0.25; // of the context: how far the cut moves at once
const MARGIN = 1.1; // the characters per token of the whole prompt, with room to spare

let last = null; // {prompt, tokens, context}: the latest count
let asked = null; // AbortController of the count in flight
let model = null; // whose tokens are counted (null: the server's current model)

/** The open story's model changed: counts are of its tokens and its context from now. */
export function setModel(name) {
  if ((name ?? null) === model) return;
  model = name ?? null;
  last = null;
}

/** The words of `text` (what the page shows as the story's length). */
export function words(text) {
  const found = text.match(/\S+/g);
  return found ? found.length : 0;
}

/** Tokens the continuations of `fields` may take (n, or best_of, × max_tokens). */
export function reserve(fields) {
  return (fields.best_of ?? fields.n ?? 1) * (fields.max_tokens ?? 16);
}

/**
 * The story as sent: all of it, or without its start when the last count says the prompt
 * and `reserved` tokens do not fit the context. {story, cutChars, cutWords, tokens}.
 */
export function fit(story, context, reserved) {
  const whole = { story, cutChars: 0, cutWords: 0, tokens: null };
  const prompt = buildPrompt(story, context);
  if (!last || last.prompt !== prompt || !last.context) return { ...whole, tokens: last?.tokens ?? null };
  const over = last.tokens + reserved - last.context;
  if (over <= 0) return { ...whole, tokens: last.tokens };
  const perToken = prompt.length / last.tokens;
  const step = Math.max(1, Math.floor(last.context * STEP * perToken));
  const need = Math.ceil(over * perToken * MARGIN);
  const cut = boundaryAfter(story, Math.ceil(need / step) * step);
  if (cut >= story.length) return { ...whole, tokens: last.tokens, impossible: true };
  const left = story.slice(0, cut);
  return {
    story: story.slice(cut),
    cutChars: cut,
    cutWords: words(left),
    tokens: Math.round(last.tokens - cut / perToken),
  };
}

/** The first paragraph start at or after `at` (else a sentence start, else `at`). */
function boundaryAfter(text, at) {
  if (at <= 0) return 0;
  const paragraph = text.indexOf("\n", at);
  if (paragraph >= 0 && paragraph - at < 2000) return paragraph + 1;
  const sentence = /[.!?]["'”’)]*\s+/g;
  sentence.lastIndex = at;
  const found = sentence.exec(text);
  return found ? found.index + found[0].length : at;
}

/** What the server counted for `prompt`: `tokens` of a `context` (the count the cut uses). */
export function remember(prompt, tokens, context) {
  last = { prompt, tokens, context };
}

/** Counts the prompt for `story` soon (the bar shows it); `done()` hears when it is in. */
export const count = debounce(async (story, context, apiKey, done) => {
  const prompt = buildPrompt(story, context);
  if (last?.prompt === prompt) return done?.();
  asked?.abort();
  asked = new AbortController();
  try {
    const { tokens, context: size } = await countTokens(prompt, apiKey, asked.signal, model);
    remember(prompt, tokens, size);
  } catch {
    return; // no server, no key: the bar waits for the next count
  }
  done?.();
}, 400);

/** Counts now (before a generation, when the last count is of other text). */
export async function countNow(story, context, apiKey) {
  const prompt = buildPrompt(story, context);
  if (last?.prompt === prompt) return;
  try {
    const { tokens, context: size } = await countTokens(prompt, apiKey, undefined, model);
    remember(prompt, tokens, size);
  } catch {
    // the generation itself will say what is wrong
  }
}

/** The context bar and the word count under the story box. */
export function show(story, context, reserved) {
  $("word-count").textContent = `${words(story).toLocaleString()} words`;
  const bar = $("context-bar");
  const plan = fit(story, context, reserved);
  if (!last?.context || plan.tokens === null) {
    bar.hidden = true;
    return plan;
  }
  bar.hidden = false;
  const size = last.context;
  const cutTokens = plan.cutChars ? last.tokens - plan.tokens : 0;
  const share = (n) => `${Math.min(100, (100 * n) / size).toFixed(2)}%`;
  $("bar-prompt").style.width = share(plan.tokens);
  $("bar-reserve").style.width = share(Math.min(reserved, Math.max(0, size - plan.tokens)));
  $("bar-cut").style.width = plan.cutChars ? share(Math.min(cutTokens, size)) : "0%";
  bar.dataset.over = String(Boolean(plan.impossible));
  const n = (x) => x.toLocaleString();
  let text = `${n(plan.tokens)} of ${n(size)} tokens, and ${n(reserved)} kept for the continuations`;
  if (plan.impossible) text += ": too long even without the story (memory, note, n × max tokens)";
  else if (plan.cutChars) text += ` · the first ${n(plan.cutWords)} words (about ${n(cutTokens)} tokens) are left out of the prompt to fit`;
  $("context-text").textContent = text;
  return plan;
}

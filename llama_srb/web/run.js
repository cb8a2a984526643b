// One generation as the page runs it: the streamed request, its chunks into the node's
// cards (text, words, finish reasons, token counts), and its timing for the top bar.

import { streamCompletion } from "./api.js";
import * as Words from "./words.js";

const MAX_NEW = 64; // refills a stream may add at once: more is not a refill but a bad index

/**
 * Streams `body` for `run` ({controller, node}) to `path` (a fork's; else v1/completions);
 * `run.id` becomes the call's response id, which live branching names it by. `open()` makes
 * the node once the server has accepted the request (and may return null to give up);
 * `update(index, choice)` hears every change to a card (a refill's new one too). Resolves
 * to null when the server finished, else to the error (an AbortError when stopped); the
 * node's open cards and its stats are settled either way.
 */
export async function stream(
  run, body, { path, apiKey, session, open, update, progress, loading },
) {
  const timing = { start: performance.now(), first: null, usage: null };
  let failure = null;
  try {
    await streamCompletion(body, {
      path,
      apiKey,
      session,
      signal: run.controller.signal,
      onOpen: () => {
        run.node = open();
        if (!run.node) run.controller.abort();
      },
      onChunk: (chunk) => {
        run.id ??= chunk.id ?? null;
        onChunk(run.node, chunk, timing, update);
      },
      onProgress: progress,
      onLoading: loading,
    });
  } catch (err) {
    failure = err;
  }
  const stopped = failure?.name === "AbortError";
  // "incomplete": the stream ended without finish reasons.
  finishOpen(run.node, failure ? (stopped ? "stopped" : "error") : "incomplete");
  if (run.node) run.node.stats = stats(run.node, timing);
  return failure;
}

/** Reads `prompt` into the server's prefix cache of `model` (null: the server's current
 * one) and nothing more (max_tokens 0), so the next continuation of it starts at once;
 * `progress` hears how far it is read, `loading` that the model loads first. Resolves
 * to null, or the error (an AbortError when cancelled). */
export async function warm(prompt, { apiKey, session, signal, progress, loading, model = null }) {
  try {
    await streamCompletion(
      model ? { prompt, max_tokens: 0, n: 1, model } : { prompt, max_tokens: 0, n: 1 },
      { apiKey, session, signal, onProgress: progress, onChunk: () => {}, onLoading: loading },
    );
    return null;
  } catch (err) {
    return err;
  }
}

export function emptyChoice(logprobs) {
  const choice = { text: "", finish_reason: null, tokens: 0, edited: false };
  if (logprobs) choice.pieces = [];
  return choice;
}

/** Choice `index` of `node`, made (with any before it) when the stream names a new one: a
 * dropped choice's refill comes under the next index, on the same stream. */
export function grow(node, index) {
  if (!Number.isInteger(index) || index < 0 || index > node.choices.length + MAX_NEW) return null;
  while (node.choices.length <= index) node.choices.push(emptyChoice(node.params?.logprobs));
  return node.choices[index];
}

export function finishOpen(node, reason) {
  for (const choice of node?.choices ?? []) choice.finish_reason ??= reason;
}

function onChunk(node, chunk, timing, update) {
  if (chunk.usage) timing.usage = chunk.usage;
  for (const delta of chunk.choices ?? []) {
    const choice = node && (node.choices[delta.index] ?? grow(node, delta.index));
    if (!choice) continue;
    if (delta.text) {
      timing.first ??= performance.now();
      choice.text += delta.text;
      // One piece per engine step and choice, so pieces ≈ tokens (with logprobs: exact).
      choice.tokens += delta.logprobs?.tokens?.length || 1;
    }
    // A new list, never a push: copies of the tree (the server's, undo's) share the old one.
    if (choice.pieces && delta.logprobs) {
      choice.pieces = [...choice.pieces, ...Words.piecesOf(delta.logprobs)];
    }
    if (delta.finish_reason) finish(node, choice, delta.finish_reason);
    update(delta.index, choice);
  }
}

function finish(node, choice, reason) {
  choice.finish_reason = reason;
  // Reaching max_tokens makes the count exact.
  if (reason === "length") choice.tokens = node.params.max_tokens ?? choice.tokens;
  if (choice.pieces) {
    const aligned = Words.align(choice.pieces, choice.text);
    if (aligned) choice.pieces = aligned;
    else delete choice.pieces; // words that do not add up to the text: show the text
  }
}

function stats(node, { start, first, usage }) {
  const end = performance.now();
  const tokens = usage?.completion_tokens ?? node.choices.reduce((sum, c) => sum + c.tokens, 0);
  // Generation speed: tokens of all n continuations over the time since the first one arrived.
  const seconds = first === null ? 0 : (end - first) / 1000;
  return {
    ttft_ms: first === null ? null : Math.round(first - start),
    tokens_per_s: seconds > 0 ? tokens / seconds : null,
    completion_tokens: tokens,
    prompt_tokens: usage?.prompt_tokens ?? null,
  };
}

// The server's API, as the UI uses it: its models, token counts, streamed completions
// (Server-Sent Events read from fetch, since EventSource cannot POST) and the story library
// (/v1/stories), and live branching (a streaming choice forked, dropped or steered). A
// network failure throws fetch's own TypeError; an answer that is not a success throws an
// ApiError.

/** An error the server answered with: its message, HTTP status, error code and, when it
 * names one, the request field (`param`) that caused it; `body`: the whole answer. */
export class ApiError extends Error {
  constructor(message, { status = null, param = null, code = null, body = null } = {}) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
    this.body = body;
  }
}

function headers(apiKey) {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

/** A name for a story, from the text of its tree's root (FNV-1a): sent as X-Session-Id, so
 * that behind a balancer (deploy/nginx.conf) every branch of one story reaches the replica
 * whose prefix cache holds it. */
export function sessionOf(rootText) {
  let hash = 0x811c9dc5;
  for (const ch of String(rootText)) {
    hash = Math.imul(hash ^ ch.codePointAt(0), 0x01000193) >>> 0;
  }
  return `story-${hash.toString(16)}`;
}

/** The server's error body (`{error: {message, param}}`) as an ApiError, whatever the status. */
async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let param = null;
  let code = null;
  let body = null;
  try {
    body = await response.json();
    if (body?.error?.message) message = body.error.message;
    if (typeof body?.error?.param === "string") param = body.error.param;
    if (typeof body?.error?.code === "string") code = body.error.code;
  } catch {
    // not JSON (a proxy's page, say): the status line is all we have
  }
  return new ApiError(message, { status: response.status, param, code, body });
}

async function call(method, path, { apiKey, session, body, signal, keepalive = false } = {}) {
  const response = await fetch(path, {
    method,
    headers: session ? { ...headers(apiKey), "X-Session-Id": session } : headers(apiKey),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    keepalive,
  });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

/** The library's routes (llama_srb/api/routes/stories.py). */
export const stories = {
  list: (apiKey) => call("GET", "v1/stories", { apiKey }).then((b) => b.data),
  create: (draft, apiKey) => call("POST", "v1/stories", { apiKey, body: draft }),
  get: (id, apiKey) => call("GET", `v1/stories/${id}`, { apiKey }),
  since: (id, revision, apiKey) => call("GET", `v1/stories/${id}?since=${revision}`, { apiKey }),
  write: (id, patch, apiKey) => call("PATCH", `v1/stories/${id}`, { apiKey, body: patch }),
  // Sent as the page goes (a reload, a closed tab): the browser finishes it alone.
  writeOnExit: (id, patch, apiKey) =>
    call("PATCH", `v1/stories/${id}`, { apiKey, body: patch, keepalive: true }),
  remove: (id, apiKey) => call("DELETE", `v1/stories/${id}`, { apiKey }),
  restore: (id, apiKey) => call("POST", `v1/stories/${id}/restore`, { apiKey }),
  duplicate: (id, apiKey) => call("POST", `v1/stories/${id}/duplicate`, { apiKey }),
};

/** Live branching (llama_srb/api/routes/live.py) on choice `index` of the streamed call `id`:
 * only the caller that made the call may act, so `auth` ({apiKey, session}) is the call's. */
export const live = {
  forkPath: (id, index) => `${choicePath(id, index)}/fork`,
  drop: (id, index, refill, auth) =>
    call("DELETE", choicePath(id, index), { ...auth, body: { refill } }),
  steer: (id, index, body, auth) => call("PATCH", choicePath(id, index), { ...auth, body }),
};

function choicePath(id, index) {
  return `v1/completions/${encodeURIComponent(id)}/choices/${index}`;
}

/** Whether `err` means the server could not be reached (or answered as a broken proxy). */
export function isOffline(err) {
  return !(err instanceof ApiError) || err.status === 502 || err.status === 503 || err.status === 504;
}

/** The prompt's tokens (the BOS the server adds included) and the server's context size. */
/** `model`: the model whose tokens count (unset: the server's current one). */
export async function countTokens(prompt, apiKey, signal, model = null) {
  const body = await call("POST", "v1/tokenize", {
    apiKey, body: model ? { prompt, model } : { prompt }, signal,
  });
  return { tokens: body.count, context: body.max_model_len };
}

/** The models the server serves, each `{id, state, error}` (state: loaded, loading,
 * unloading, sleeping, available or failed; a server without states: loaded). */
export async function fetchModels(apiKey) {
  const body = await call("GET", "v1/models", { apiKey });
  return (body.data ?? []).map((card) => ({
    id: String(card.id),
    state: typeof card.state === "string" ? card.state : "loaded",
    error: typeof card.error === "string" ? card.error : null,
  }));
}

/**
 * POSTs a streamed completion (to `path`: a fork's, else v1/completions); once the server
 * has accepted it calls `onOpen()`, then `onLoading(model, seconds)` while the model it
 * names loads first (the server's `: loading model NAME (N s)` comments), then
 * `onProgress(prompt_progress)` while the prompt is read (llama.cpp's {total, cache,
 * processed, time_ms}) and `onChunk(json)` for each event until `[DONE]` (with best_of,
 * once, for the whole answer). Aborting `signal` closes the connection, which cancels the
 * generation on the server.
 */
export async function streamCompletion(
  body,
  { path = "v1/completions", apiKey, session, signal, onOpen, onChunk, onProgress, onLoading },
) {
  // best_of cannot be streamed (the best are known at the end): its one answer is the chunk.
  const whole = (body.best_of ?? 0) > (body.n ?? 1);
  const streamed = whole
    ? {}
    : { stream: true, stream_options: { include_usage: true }, return_progress: true };
  const response = await fetch(path, {
    method: "POST",
    headers: { ...headers(apiKey), "X-Session-Id": session },
    body: JSON.stringify({ ...body, ...streamed }),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  onOpen?.();
  if (whole) return onChunk(await response.json());
  for await (const data of sseData(response.body, onLoading && loadingComment(onLoading))) {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) {
      throw new ApiError(chunk.error.message ?? "the server failed", {
        param: chunk.error.param ?? null,
      });
    }
    if (chunk.prompt_progress) onProgress?.(chunk.prompt_progress);
    else onChunk(chunk);
  }
}

const LOADING = /^: ?loading model (.+) \((\d+) s\)$/;

/** A comment line's handler that hears the server's loading notices. */
function loadingComment(onLoading) {
  return (line) => {
    const found = LOADING.exec(line);
    if (found) onLoading(found[1], Number(found[2]));
  };
}

/** The `data:` payloads of an SSE byte stream; events end with a blank line. Comment
 * lines (`:`) go to `onComment`. */
async function* sseData(stream, onComment = null) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (onComment) for (const l of event.split("\n")) if (l.startsWith(":")) onComment(l);
      const lines = event.split("\n").filter((l) => l.startsWith("data:"));
      if (lines.length) yield lines.map((l) => l.slice(5).trimStart()).join("\n");
    }
  }
}

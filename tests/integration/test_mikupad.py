"""Mikupad as writers run it: `mikupad.html` opened as a file, against the server as `make
serve` starts it (no setting changed). A page of our own, opened from a file:// URL in
Debian's chromium, sends Mikupad's requests as its page does (mikupad.html:
llamaCppTokenCount, llamaCppCompletion, openaiModels, openaiCompletion, parseEventStream,
openaiOobaAbortCompletion, and predict()'s cancel, which also aborts the stream), so the
browser does what it does for Mikupad: `Origin: null`, CORS preflights, and reading the
answers only if the server allows it. Mikupad's own page loads its scripts from a CDN,
which tests cannot reach; its request functions are ported here.

And the other side of the origin policy (api/origins.py): a page of another web site
cannot use the API, simple requests included, unless it holds the server's key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import CHROMIUM
from tests.support.server import RunningServer, run_server

pytestmark = pytest.mark.models(GEMMA)
PROMPT = "The lighthouse keeper climbed the stairs one last time. At the top he found"
KEY = "mikupad-test-key"

# The page: Mikupad's fetches (headers, bodies, stream parsing), our code.
PAGE = """<!doctype html><meta charset="utf-8"><title>mikupad</title><script>
function headers(key, json = true) {
  return {...(json ? {'Content-Type': 'application/json'} : {}),
          ...(key ? {'Authorization': `Bearer ${key}`} : {})};
}
// parseEventStream: lines; `data:` JSON; [DONE] ends; error.message throws.
async function* parseEventStream(body) {
  let buf = '';
  for await (const chunk of body.pipeThrough(new TextDecoderStream())) {
    const lines = (buf + chunk).split(/\\n|\\r\\n?/);
    buf = lines.pop();
    for (const line of lines) {
      const m = /^(?<name>.*?)(?:: ?(?<value>.*))?$/s.exec(line);
      if (!line || m.groups.name !== 'data') continue;
      if (m.groups.value === '[DONE]') return;
      const json = JSON.parse(m.groups.value);
      if (json.error?.message) throw new Error(json.error.message);
      yield json;
    }
  }
}
window.mikupad = {
  // llamaCppTokenCount: before every generation; a non-200 aborts predict().
  async tokenCount(endpoint, key, content) {
    const res = await fetch(`${endpoint}/tokenize`, {method: 'POST', headers: headers(key),
                                                     body: JSON.stringify({content})});
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    return (await res.json()).tokens.length + 1;
  },
  // openaiModels: always `Bearer ${key}`, even an empty one.
  async models(endpoint, key) {
    const res = await fetch(`${endpoint}/v1/models`, {
      method: 'GET',
      headers: {'Content-Type': 'application/json', 'Authorization': `Bearer ${key}`}});
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    return (await res.json()).data.map(m => m.id);
  },
  // llamaCppCompletion / openaiCompletion: the tokens and each token's alternatives;
  // `cancelAfter` tokens into the stream, predict()'s cancel: the stop request, then abort.
  async complete(endpoint, key, mode, body, cancelAfter) {
    const ac = new AbortController();
    const path = mode === 'llamacpp' ? '/completion' : '/v1/completions';
    const res = await fetch(`${endpoint}${path}`, {method: 'POST', headers: headers(key),
                                                   body: JSON.stringify(body), signal: ac.signal});
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const out = {tokens: [], probs: [], stopped: null};
    const read = (chunk) => {
      if (mode === 'llamacpp') {
        const choice = chunk.completion_probabilities?.[0];
        const token = chunk.content || chunk.token;
        if (token === undefined) return;  // the final event: its text was streamed
        out.tokens.push(token);
        out.probs.push(Object.values(choice?.top_logprobs || chunk.top_logprobs || {})
          .map(t => Math.exp(t.logprob)));
      } else {
        out.tokens.push(chunk.choices[0].text);
        out.probs.push(Object.values(chunk.choices[0].logprobs?.top_logprobs?.[0] || {}));
      }
    };
    if (!body.stream) {
      const data = await res.json();
      for (const entry of (mode === 'llamacpp' ? data.completion_probabilities : [])) read(entry);
      return out;
    }
    try {
      for await (const chunk of parseEventStream(res.body)) {
        read(chunk);
        if (cancelAfter && out.tokens.length >= cancelAfter) {
          // openaiOobaAbortCompletion: a POST with no headers and no body
          const stop = mode === 'openai'
            ? await fetch(`${endpoint}/v1/internal/stop-generation`, {method: 'POST'}) : null;
          out.stopped = stop && await stop.json();
          ac.abort();
        }
      }
    } catch (e) {
      if (e.name !== 'AbortError') throw e;
    }
    return out;
  },
  // What a page of another site might send: a readable CORS request, and a "simple"
  // one (no preflight, unreadable answer) whose only use is its side effect.
  async foreign(endpoint, key) {
    const result = {};
    try {
      const res = await fetch(`${endpoint}/v1/completions`, {method: 'POST', headers: headers(key),
        body: JSON.stringify({prompt: 'x', max_tokens: 2})});
      result.read = res.status;
    } catch (e) { result.read = String(e); }
    await fetch(`${endpoint}/v1/completions`, {method: 'POST', mode: 'no-cors',
      headers: {'Content-Type': 'text/plain'}, body: JSON.stringify({prompt: 'x', max_tokens: 2})});
    return result;
  },
};
</script>"""


@pytest.fixture(scope="module")
def make_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The server as `make serve` starts it: the default model, no setting changed."""
    with run_server(tmp_path_factory.mktemp("make-serve")) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(
        tmp_path_factory.mktemp("keyed"), "--api-key", KEY, "--n-ctx", "2048"
    ) as running:
        yield running


@pytest.fixture
def file_page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """The page opened from a file, as a writer opens mikupad.html."""
    path = tmp_path / "mikupad.html"
    path.write_text(PAGE)
    context = browser.new_context()
    page = context.new_page()
    page.goto(path.as_uri())
    assert page.evaluate("origin") == "null"  # file pages have an opaque origin
    yield page
    context.close()


@pytest.fixture
def foreign_page(browser: Any) -> Iterator[Any]:
    """A page of another web site (https://stories.example, served by the browser itself),
    in a chromium without its Local Network Access checks, which stop a public page's
    requests to loopback before they leave: so that the server's own refusal is what is
    tested, as Firefox and Safari (which have no such check) send the requests."""
    unguarded = browser.browser_type.launch(
        executable_path=str(CHROMIUM),
        headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-features=LocalNetworkAccessChecks"],
    )
    page = unguarded.new_page()
    page.route(
        "https://stories.example/", lambda route: route.fulfill(body=PAGE, content_type="text/html")
    )
    page.goto("https://stories.example/")
    yield page
    unguarded.close()


def preflights(server: RunningServer, route: str) -> float:
    counted = server.metrics()
    return sum(
        v
        for k, v in counted.items()
        if k.startswith("llama_srb_http_requests_total{")
        and f'route="{route}"' in k
        and 'method="OPTIONS"' in k
        and 'status="204"' in k
    )


def http_count(server: RunningServer, route: str, method: str, status: int) -> float:
    name = f'llama_srb_http_requests_total{{method="{method}",route="{route}",status="{status}"}}'
    return server.metrics().get(name, 0.0)


def ended(server: RunningServer) -> float:
    return sum(
        v for k, v in server.metrics().items() if k.startswith("llama_srb_requests_ended_total")
    )


def cancelled(server: RunningServer) -> float:
    return server.metrics().get('llama_srb_requests_ended_total{outcome="cancelled"}', 0.0)


def call(page: Any, method: str, *args: Any) -> Any:
    return page.evaluate(f"(args) => window.mikupad.{method}(...args)", list(args))


def llamacpp_body(**options: Any) -> dict[str, Any]:
    """predict()'s default preset in llama.cpp mode (llamaCppCompletion's body)."""
    return {
        "model": "", "prompt": PROMPT, "temperature": 0.7, "repeat_penalty": 1.1,
        "repeat_last_n": 256, "penalize_nl": False, "ignore_eos": False,
        "presence_penalty": 0, "frequency_penalty": 0, "top_p": 0.95, "top_k": 40,
        "min_p": 0, "n_predict": 16, "n_probs": 10, "post_sampling_probs": False,
        "stream": True, "cache_prompt": True, **options,
    }  # fmt: skip


def openai_body(model: str, **options: Any) -> dict[str, Any]:
    """openaiConvertOptions' body (no `n`; logprobs 10; repetition_* names)."""
    return {
        "model": model, "prompt": PROMPT, "temperature": 0.7, "repetition_penalty": 1.1,
        "repetition_penalty_range": 256, "penalize_nl": False, "ban_eos_token": False,
        "presence_penalty": 0, "frequency_penalty": 0, "mirostat_mode": 0, "top_p": 0.95,
        "top_k": 40, "min_p": 0, "max_tokens": 16, "logprobs": 10, "stream": True, **options,
    }  # fmt: skip


def test_llamacpp_mode_from_a_file(make_serve: RunningServer, file_page: Any) -> None:
    """The token count, then the stream with each token's 10 alternatives; the browser
    asked first (a preflight per route: JSON bodies are not simple requests)."""
    url = make_serve.base_url
    assert call(file_page, "tokenCount", url, "", PROMPT) > 1
    out = call(file_page, "complete", url, "", "llamacpp", llamacpp_body(), 0)
    assert "".join(out["tokens"]) and all(len(p) == 10 for p in out["probs"])
    assert all(0 < p <= 1 for probs in out["probs"] for p in probs)
    assert preflights(make_serve, "/tokenize") >= 1 and preflights(make_serve, "/completion") >= 1


def test_llamacpp_mode_not_streamed(make_serve: RunningServer, file_page: Any) -> None:
    """Without streaming Mikupad reads only `completion_probabilities`."""
    body = llamacpp_body(stream=False)
    out = call(file_page, "complete", make_serve.base_url, "", "llamacpp", body, 0)
    assert len(out["tokens"]) == 16 and all(len(p) == 10 for p in out["probs"])


def test_llamacpp_mode_cancel(make_serve: RunningServer, file_page: Any) -> None:
    """Cancel aborts the stream: the generation ends there (n_predict -1 would otherwise
    run on): the server counts it cancelled."""
    before = cancelled(make_serve)
    body = llamacpp_body(n_predict=-1, ignore_eos=True)
    out = call(file_page, "complete", make_serve.base_url, "", "llamacpp", body, 3)
    assert len(out["tokens"]) >= 3
    for _ in range(200):  # the server sees the disconnect on its next read
        if cancelled(make_serve) > before:
            break
        time.sleep(0.05)
    assert cancelled(make_serve) == before + 1


def test_openai_mode_from_a_file(make_serve: RunningServer, file_page: Any) -> None:
    """openaiModels (its `Authorization: Bearer ` asks a preflight), then /v1/completions
    streamed with `logprobs.top_logprobs[0]`; Cancel's stop-generation is a simple POST
    (no preflight) whose answer the page can read, and the aborted stream ends the
    generation."""
    url = make_serve.base_url
    (model,) = call(file_page, "models", url, "")
    assert model == make_serve.model_id and preflights(make_serve, "/v1/models") >= 1
    out = call(file_page, "complete", url, "", "openai", openai_body(model), 0)
    assert "".join(out["tokens"]) and all(len(p) >= 10 for p in out["probs"] if p)
    before = http_count(make_serve, "/v1/internal/stop-generation", "POST", 200)
    body = openai_body(model, max_tokens=4000, ban_eos_token=True)
    cancelled = call(file_page, "complete", url, "", "openai", body, 3)
    assert cancelled["stopped"] == "OK"
    assert http_count(make_serve, "/v1/internal/stop-generation", "POST", 200) == before + 1


def test_another_sites_page_cannot_use_the_api(
    make_serve: RunningServer, foreign_page: Any
) -> None:
    """Its CORS request gets no answer it can read, and its simple POST (sent without a
    preflight) is refused before it generates anything."""
    before_403, before_ended = (
        http_count(make_serve, "/v1/completions", "POST", 403),
        ended(make_serve),
    )
    result = call(foreign_page, "foreign", make_serve.base_url, "")
    assert "Failed to fetch" in str(result["read"])
    # The simple request reached the server and was refused; nothing was generated.
    assert http_count(make_serve, "/v1/completions", "POST", 403) > before_403
    assert ended(make_serve) == before_ended
    refused = httpx.post(
        f"{make_serve.base_url}/v1/completions",
        content=json.dumps({"prompt": "x", "max_tokens": 2}),
        headers={"Origin": "https://stories.example", "Content-Type": "text/plain"},
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"


def test_with_a_key_any_page_needs_it(
    keyed: RunningServer, foreign_page: Any, browser: Any, tmp_path: Path
) -> None:
    """--api-key: a page of another site that holds the key may use the API, and without
    it gets the 401; a file page needs the key as well."""
    assert call(foreign_page, "foreign", keyed.base_url, KEY)["read"] == 200
    assert call(foreign_page, "foreign", keyed.base_url, "")["read"] == 401
    path = tmp_path / "page.html"
    path.write_text(PAGE)
    context = browser.new_context()
    page = context.new_page()
    page.goto(path.as_uri())
    with pytest.raises(Exception, match="HTTP 401"):
        call(page, "tokenCount", keyed.base_url, "", PROMPT)
    assert call(page, "tokenCount", keyed.base_url, KEY, PROMPT) > 1
    context.close()

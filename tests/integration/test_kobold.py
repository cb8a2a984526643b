"""KoboldCpp's API as its clients use it, answered as KoboldCpp answers (field names and
types from koboldcpp.py 1.76: do_GET, do_POST, generate_text, handle_sse_stream).

- KoboldAI Lite (KoboldCpp's klite.embd): connect_custom_endpoint (the model, the KoboldAI
  API version, the context, KoboldCpp's version), the generate payload of
  prepare_submit_generation / dispatch_submit_generation with Lite's default localsettings
  (instruct mode), read by kobold_api_stream (`results[0].text`, `finish_reason`) and
  kobold_api_stream_sse (its `event: …\\ndata: …\\n\\n` regex), poll_pending_response's
  /api/extra/generate/check, abort_generation's /api/extra/abort, kcpp_tokenize.
- Mikupad (mikupad.html): koboldCppConvertOptions, koboldCppCompletion,
  koboldCppTokenize, koboldCppAbortCompletion.
- SillyTavern's koboldcpp type: its tokenizer's /api/extra/tokencount (src/endpoints/
  tokenizers.js), its abort (text-completions.js abortKoboldCppRequest: no body).
The default model only: these are the API's shapes, the same for either model.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.support.paths import assert_same_greedy, completion_steps
from tests.support.server import RunningServer

pytestmark = pytest.mark.models(GEMMA)
TIMEOUT = 180
HEADERS = {"Content-Type": "application/json"}  # get_kobold_header() without a key
INSTRUCT = "\n### Instruction:\nWrite the first line of a sea shanty.\n### Response:\n"


def lite_payload(prompt: str = INSTRUCT, **changes: Any) -> dict[str, Any]:
    """prepare_submit_generation's params with Lite's default localsettings (instruct
    mode), as dispatch_submit_generation completes them for KoboldCpp ≥ 1.74 (mirostat,
    min-p, presence penalty and logit bias fields; memory and trim_stop; the genkey; the
    stop sequences and EOS switch of KoboldAI API ≥ 1.2.4); `prompt` set inside them."""
    payload: dict[str, Any] = {
        "n": 1,
        "max_context_length": 4096,
        "max_length": 24,
        "rep_pen": 1.07,
        "temperature": 0.7,
        "top_p": 0.92,
        "top_k": 100,
        "top_a": 0,
        "typical": 1,
        "tfs": 1,
        "rep_pen_range": 360,
        "rep_pen_slope": 0.7,
        "sampler_order": [6, 0, 1, 3, 4, 2, 5],
        "memory": "",
        "trim_stop": True,
        "genkey": "KCPP4821",
        "min_p": 0.0,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "smoothing_factor": 0.0,
        "banned_tokens": [],
        "render_special": False,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "prompt": prompt,
        "quiet": True,
        "stop_sequence": ["### Instruction:", "### Response:"],
        "use_default_badwordsids": False,
        "bypass_eos": False,
    }
    return {**payload, **changes}


def lite_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """kobold_api_stream_sse's parser: `^event: (.*)\\ndata: (.*)\\n\\n` over the buffer."""
    buffer = ""
    for chunk in response.iter_text():
        buffer += chunk
        while (m := re.search(r"^event: (.*)\n(?:data: (.*))\n\n", buffer, re.M)) is not None:
            yield {"event": m.group(1), "data": json.loads(m.group(2))}
            buffer = buffer[m.end() :]
    assert not buffer.strip(), f"left unparsed: {buffer!r}"


def generate(server: RunningServer, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/generate", json=body, headers=HEADERS, timeout=TIMEOUT, **kwargs
    )


def test_lite_connects(server: RunningServer) -> None:
    """connect_custom_endpoint: `result` of /api/v1/model names the model (not "ReadOnly"),
    then the KoboldAI version, the max context, and KoboldCpp's version (a string Lite
    compares with its feature thresholds: ≥ 1.74 turns on XTC, SSE and the genkey)."""
    get = lambda path: httpx.get(server.base_url + path, headers=HEADERS, timeout=10).json()  # noqa: E731
    assert get("/api/v1/model") == {"result": server.model_id}
    assert get("/api/v1/info/version") == {"result": "1.2.5"}
    assert get("/api/v1/config/max_context_length") == {"value": 8192}
    assert get("/api/extra/true_max_context_length") == {"value": 8192}
    assert isinstance(get("/api/v1/config/max_length")["value"], int)
    version = get("/api/extra/version")
    assert version["result"] == "KoboldCpp" and version["version"] >= "1.74"
    assert version["protected"] is False and version["vision"] is False
    assert get("/api/extra/preloadstory") == {}  # not a KoboldAI story: nothing loaded


def test_lite_generates(server: RunningServer) -> None:
    """kobold_api_stream (Lite's default outside KoboldCpp's own page: no token streaming)
    reads `results[0].text` and `finish_reason`; KoboldCpp's result fields and types."""
    response = generate(server, lite_payload())
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert isinstance(result["text"], str) and result["text"]
    assert "### Instruction:" not in result["text"]  # trim_stop
    assert result["finish_reason"] in ("stop", "length")
    assert result["logprobs"] is None
    assert result["prompt_tokens"] > 0 and 0 < result["completion_tokens"] <= 24


def test_lite_streams(server: RunningServer) -> None:
    """kobold_api_stream_sse: `event: message` events whose data has `token` (appended)
    and `finish_reason` ("stop" sets last_stop_reason); KoboldCpp sends "null" until the
    last event."""
    body = lite_payload()
    with httpx.stream(
        "POST",
        f"{server.base_url}/api/extra/generate/stream",
        json=body,
        headers=HEADERS,
        timeout=TIMEOUT,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(lite_events(response))
    assert events and all(e["event"] == "message" for e in events)
    text = "".join(e["data"]["token"] for e in events)
    reasons = [e["data"]["finish_reason"] for e in events]
    assert text and all(r == "null" for r in reasons[:-1]) and reasons[-1] in ("stop", "length")


def test_n_results_from_one_prompt(server: RunningServer) -> None:
    """KoboldAI's API carries `n` in the request and one result per output: n=3 gives
    three texts, decoded together from one prompt evaluation."""
    response = generate(server, lite_payload(n=3, temperature=1.0))
    assert response.status_code == 200, response.text
    texts = [r["text"] for r in response.json()["results"]]
    assert len(texts) == 3 and len(set(texts)) == 3


def test_sampler_order_chooses_the_samplers(server: RunningServer) -> None:
    """Top-k 1 makes every result the same while its id (0) is in sampler_order; left out
    of it, top-k does not run (KoboldCpp's SampleLogits), and the results differ. Each
    result is a row of its own, rounded a little differently by its place in the batch:
    "the same" is the same greedy text up to a near tie (tests/support/paths.py), judged
    on the model's logprobs (no repetition penalty, so they are what top-k 1 chose by)."""
    picks = {}
    for name, order, prompt in (
        ("with", [6, 0, 1, 3, 4, 2, 5], "Counting: 1, 2, 3, 4, 5, 6, 7,"),  # no near tie
        ("without", [6, 1, 3, 4, 2, 5], INSTRUCT),
    ):
        body = lite_payload(prompt, n=3, temperature=1.5, top_k=1, top_p=1.0, sampler_order=order)
        body |= {"rep_pen": 1.0, "logprobs": True, "sampler_seed": 7}
        response = generate(server, body)
        assert response.status_code == 200, response.text
        picks[name] = response.json()["results"]
    first, *others = (completion_steps(r) for r in picks["with"])
    for steps in others:
        assert_same_greedy(first, steps, at_least=4)
    assert len({r["text"] for r in picks["without"]}) == 3


def test_the_stop_sequence_stays_unless_trimmed(server: RunningServer) -> None:
    """KoboldCpp keeps the stop sequence at the end of the text unless `trim_stop`. Greedy
    on a prompt whose continuation holds an "e" within its first tokens: a sampled one once
    wrote a numbered list of 24 tokens with none."""
    colors = "The three primary colors are red, yellow and"
    body = {**lite_payload(colors, stop_sequence=["e"], n=2), "temperature": 0}
    kept = generate(server, {**body, "trim_stop": False}).json()
    trimmed = generate(server, {**body, "trim_stop": True}).json()
    for result in kept["results"]:
        assert result["text"].endswith("e") and result["text"].count("e") == 1
    for result in trimmed["results"]:
        assert "e" not in result["text"]


def test_memory_stays_and_the_prompts_beginning_goes(server: RunningServer) -> None:
    """A prompt longer than max_context_length: KoboldCpp cuts its beginning, keeping the
    memory and room for max_length, instead of refusing it."""
    long_story = "The tide came in over the old stones. " * 400  # ~4,000 tokens
    body = lite_payload(long_story, memory="[Genre: sea stories]\n", max_context_length=512)
    response = generate(server, body)
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert result["prompt_tokens"] <= 512 - 24


def test_polled_check_and_abort_by_genkey(server: RunningServer) -> None:
    """poll_pending_response reads /api/extra/generate/check {genkey} for the text so far;
    abort_generation sends /api/extra/abort {genkey}: the generation ends, answering what
    it had. Another client (another page origin) can neither read nor stop it, and an
    abort without a genkey (Mikupad's, SillyTavern's) stops nothing."""
    body = lite_payload(genkey="KCPP7001", max_length=2000, stop_sequence=[], n=1)
    body["use_default_badwordsids"] = True  # no end-of-text: it runs until aborted
    answer: dict[str, httpx.Response] = {}
    worker = threading.Thread(target=lambda: answer.update(r=generate(server, body)))
    worker.start()
    check = f"{server.base_url}/api/extra/generate/check"
    other = {**HEADERS, "Origin": "http://localhost:3000"}
    pending = ""
    for _ in range(600):  # until it has written something
        pending = httpx.post(check, json={"genkey": "KCPP7001"}, headers=HEADERS).json()["results"][
            0
        ]["text"]
        if pending:
            break
        time.sleep(0.05)
    assert pending
    assert httpx.post(check, json={"genkey": "KCPP7001"}, headers=other).json() == {
        "results": [{"text": ""}]
    }
    abort = f"{server.base_url}/api/extra/abort"
    refused = {"success": "false", "done": "false"}
    assert httpx.post(abort, json={"genkey": "KCPP7001"}, headers=other).json() == refused
    assert httpx.post(abort).json() == refused  # no body: Mikupad's and SillyTavern's
    assert worker.is_alive()
    stopped = httpx.post(abort, json={"genkey": "KCPP7001"}, headers=HEADERS).json()
    assert stopped == {"success": "true", "done": "true"}
    worker.join(timeout=TIMEOUT)
    (result,) = answer["r"].json()["results"]
    assert result["text"].startswith(pending) and result["completion_tokens"] < 2000
    assert result["finish_reason"] == "abort"  # not "length": it was stopped


def test_a_guessed_genkey_reads_nothing_and_an_aborted_stream_says_so(
    server: RunningServer,
) -> None:
    """The issue's attack: Lite (a file page: `Origin: null`) streams with KCPP4711;
    another page on the same machine tries keys, the right one among them: it reads and
    stops nothing. Lite's own abort stops it, and its stream's last event says "abort"."""
    lite = {**HEADERS, "Origin": "null"}
    guesser = {**HEADERS, "Origin": "http://localhost:7777"}
    body = lite_payload(genkey="KCPP4711", max_length=2000, stop_sequence=[])
    body["use_default_badwordsids"] = True  # no end-of-text: it runs until aborted
    check = f"{server.base_url}/api/extra/generate/check"
    abort = f"{server.base_url}/api/extra/abort"
    with httpx.stream(
        "POST",
        f"{server.base_url}/api/extra/generate/stream",
        json=body,
        headers=lite,
        timeout=TIMEOUT,
    ) as response:
        assert response.headers["x-genkey"] == "KCPP4711"
        events = lite_events(response)
        first = next(events)  # it runs
        assert first["data"]["finish_reason"] == "null"
        for guess in [*(f"KCPP{n:04d}" for n in range(4690, 4720)), "KCPP4711"]:
            read = httpx.post(check, json={"genkey": guess}, headers=guesser).json()
            assert read == {"results": [{"text": ""}]}, guess
            stop = httpx.post(abort, json={"genkey": guess}, headers=guesser).json()
            assert stop == {"success": "false", "done": "false"}, guess
        assert httpx.post(check, json={"genkey": "KCPP4711"}, headers=lite).json()["results"][0]
        stopped = httpx.post(abort, json={"genkey": "KCPP4711"}, headers=lite).json()
        assert stopped == {"success": "true", "done": "true"}
        rest = list(events)
    assert rest and rest[-1]["data"]["finish_reason"] == "abort"


def test_a_generation_without_a_genkey_gets_an_unguessable_one(server: RunningServer) -> None:
    body = lite_payload()
    del body["genkey"]
    response = generate(server, body)
    assert response.status_code == 200 and re.fullmatch(
        r"[0-9a-f]{32}", response.headers["x-genkey"]
    )


@pytest.mark.parametrize(
    ("body", "first_is_bos"),
    [
        ({"prompt": INSTRUCT, "special": False}, False),  # Lite's kcpp_tokenize, ST's
        ({"prompt": INSTRUCT}, True),  # Mikupad's koboldCppTokenize: it drops ids[0]
    ],
)
def test_tokencount(server: RunningServer, body: dict[str, Any], first_is_bos: bool) -> None:
    """`{"value": count, "ids": [...]}`: SillyTavern reads `value`, Lite and Mikupad `ids`."""
    response = httpx.post(f"{server.base_url}/api/extra/tokencount", json=body, timeout=30)
    assert response.status_code == 200
    data = response.json()
    plain = httpx.post(f"{server.base_url}/tokenize", json={"content": INSTRUCT}).json()["tokens"]
    assert data["value"] == len(data["ids"]) and all(isinstance(i, int) for i in data["ids"])
    assert data["ids"][1:] == plain if first_is_bos else data["ids"] == plain


def mikupad_options(**options: Any) -> dict[str, Any]:
    """koboldCppConvertOptions over Mikupad's llama.cpp options (llamaCppCompletion's
    body): n_ctx, n_predict, n_probs, repeat_penalty, repeat_last_n, tfs_z, typical_p,
    seed, stop, ignore_eos renamed to KoboldCpp's names, the rest sent as they are."""
    base: dict[str, Any] = {
        "model": "",
        "prompt": INSTRUCT,
        "temperature": 0.7,
        "dynatemp_range": 0,
        "dynatemp_exponent": 1,
        "repeat_penalty": 1.1,
        "repeat_last_n": 256,
        "penalize_nl": False,
        "ignore_eos": False,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": 0,
        "n_predict": 12,
        "n_probs": 10,
        "stream": False,
        **options,
    }
    renames = {
        "n_ctx": "max_context_length",
        "n_predict": "max_length",
        "n_probs": "logprobs",
        "repeat_penalty": "rep_pen",
        "repeat_last_n": "rep_pen_range",
        "tfs_z": "tfs",
        "typical_p": "typical",
        "seed": "sampler_seed",
        "stop": "stop_sequence",
        "ignore_eos": "use_default_badwordsids",
    }
    return {renames.get(k, k): v for k, v in base.items()}


def test_mikupad_koboldcpp_mode_with_token_probabilities(server: RunningServer) -> None:
    """koboldCppCompletion, not streamed: the tokens come from
    `results[0].logprobs.content` (`token`, and `top_logprobs` of {token, logprob}, made
    probabilities with Math.exp)."""
    response = generate(server, mikupad_options())
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    content = result["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == result["text"]
    for token in content:
        probs = [math.exp(t["logprob"]) for t in token["top_logprobs"]]
        assert len(probs) == 5 and all(0 < p <= 1 for p in probs)
    offsets = result["logprobs"]["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)


def test_mikupad_koboldcpp_mode_streamed(server: RunningServer) -> None:
    """koboldCppCompletion streamed: parseEventStream over /api/extra/generate/stream,
    each event's `token` (no probabilities in KoboldCpp's stream)."""
    body = mikupad_options(stream=True)
    with httpx.stream(
        "POST", f"{server.base_url}/api/extra/generate/stream", json=body, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200
        tokens = [e["data"]["token"] for e in lite_events(response)]
    assert "".join(tokens)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": "x", "max_length": 0}, "max_length"),
        ({"prompt": "x", "sampler_order": [0, 9]}, "unknown sampler ids [9]"),
        ({"prompt": "x", "sampler_order": [0, 1, 2, 3, 4, 5, 6, 0]}, "sampler_order"),
        ({"prompt": "x", "custom_token_bans": "12,abc"}, "custom_token_bans"),
        ({"prompt": "x", "genkey": "K" * 129}, "genkey"),
        ({"prompt": "x", "images": ["aGk="]}, "images"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "n": 1000}, "n must be"),
    ],
)
def test_bad_fields_are_400s_in_koboldcpps_shape(
    server: RunningServer, body: dict[str, Any], words: str
) -> None:
    response = generate(server, body)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail["type"] == "bad_input" and words in detail["msg"]


def test_the_stream_carries_one_text(server: RunningServer) -> None:
    response = httpx.post(
        f"{server.base_url}/api/extra/generate/stream",
        json={"prompt": "x", "n": 2},
        timeout=TIMEOUT,
    )
    assert response.status_code == 400 and "/api/v1/generate" in response.json()["detail"]["msg"]

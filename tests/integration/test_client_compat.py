"""The clients writers use, replayed against the default server with no setting changed:
each request built field for field as the client's source builds it, each answer read the
way that source reads it. The helpers below are ports of the named client functions.

- SillyTavern 1.18 (github.com/SillyTavern/SillyTavern, checked on the Vibecoder9000 fork):
  `public/scripts/textgen-settings.js` (createTextGenGenerationData, generateTextGenWithStreaming,
  parseTextgenLogprobs, parseTabbyLogprobs), `public/script.js` (extractMessageFromData,
  extractMultiSwipes, parseAndSaveLogprobs), `public/scripts/sse-stream.js`,
  `src/endpoints/backends/text-completions.js` (/status, /props, /generate),
  `src/endpoints/tokenizers.js` (/remote/textgenerationwebui/encode), `src/constants.js`
  (VLLM_KEYS, OPENAI_KEYS), `public/scripts/openai.js` and
  `src/endpoints/backends/chat-completions.js` (the Custom chat source).
- Mikupad (github.com/lmg-anon/mikupad b2a2a3e): `mikupad.html` (predict, getTokenCount,
  llamaCppCompletion, openaiConvertOptions, openaiCompletion, openaiChatCompletion,
  parseEventStream).
- Loom (github.com/socketteer/loom 91ca920): `gpt.py` (openAI_generate,
  format_openAI_response).
- LangChain (langchain-openai): `langchain_openai/llms/base.py` (BaseOpenAI._generate,
  create_llm_result).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from llama_srb.api.input.chat import packaged
from tests.integration.bundled import GEMMA, ModelFacts
from tests.integration.st_client import (
    TIMEOUT,
    st_check_error,
    st_events,
    st_parse_tabby_logprobs,
    st_parse_textgen_logprobs,
    st_textgen_stream,
    st_textgen_whole,
)
from tests.support.server import RunningServer, run_server

SERVED = "<the served model id>"  # in a parametrized body: replaced by the server's model id
STORY = (
    "The old lighthouse keeper climbed the stairs one last time. At the top, he found a"
    " letter tucked under the lamp. It said:"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    """A server as `make serve` runs it (a smaller context), one per bundled model, for
    this module alone: its hundred-odd requests fill the prefix cache until it evicts, and
    in the holes that leaves a near-tie can go the other way (README, "Known limits"), which
    the shared server's tests must not meet. Its seeded tests compare a whole answer with
    a streamed one: no request here depends on timing (no stream is dropped half way), so
    the server runs the same steps, and writes the same text, on every run."""
    tmp = tmp_path_factory.mktemp(f"client_compat-{bundled_model}")
    with run_server(tmp, "--model", bundled_model, "--n-ctx", "8192") as running:
        yield running


def served(server: RunningServer, body: dict) -> dict:
    return {k: server.model_id if v == SERVED else v for k, v in body.items()}


# == SillyTavern ================================================================================

TEXTGEN_TYPES = ["vllm", "aphrodite", "tabby", "koboldcpp", "ooba", "generic", "llamacpp"]
SENDS_N = {"vllm", "aphrodite", "tabby", "llamacpp"}  # "Multiple swipes per generation"
UNDEFINED = object()  # JSON.stringify drops it

# textgen-settings.js: textgenerationwebui_settings (the defaults) and sampler orders
ST = {
    "temp": 0.7,
    "temperature_last": True,
    "top_p": 0.5,
    "top_k": 40,
    "top_a": 0,
    "tfs": 1,
    "epsilon_cutoff": 0,
    "eta_cutoff": 0,
    "typical_p": 1,
    "min_p": 0,
    "rep_pen": 1.2,
    "rep_pen_range": 0,
    "rep_pen_decay": 0,
    "rep_pen_slope": 1,
    "no_repeat_ngram_size": 0,
    "penalty_alpha": 0,
    "num_beams": 1,
    "length_penalty": 1,
    "min_length": 0,
    "encoder_rep_pen": 1,
    "freq_pen": 0,
    "presence_pen": 0,
    "skew": 0,
    "do_sample": True,
    "early_stopping": False,
    "smoothing_factor": 0.0,
    "smoothing_curve": 1.0,
    "dry_allowed_length": 2,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_sequence_breakers": '["\\n", ":", "\\"", "*"]',
    "dry_penalty_last_n": 0,
    "max_tokens_second": 0,
    "add_bos_token": True,
    "ban_eos_token": False,
    "skip_special_tokens": True,
    "include_reasoning": True,
    "mirostat_mode": 0,
    "mirostat_tau": 5,
    "mirostat_eta": 0.1,
    "guidance_scale": 1,
    "negative_prompt": "",
    "grammar_string": "",
    "ignore_eos_token": False,
    "spaces_between_special_tokens": True,
    "speculative_ngram": False,
    "xtc_threshold": 0.1,
    "xtc_probability": 0,
    "nsigma": 0.0,
    "min_keep": 0,
    "adaptive_target": -0.01,
    "adaptive_decay": 0.9,
}
LLAMACPP_ORDER = [
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
    "adaptive_p",
]
OOBA_ORDER = [
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "dry",
    "temperature",
    "dynamic_temperature",
    "quadratic_sampling",
    "top_n_sigma",
    "top_k",
    "top_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "tfs",
    "top_a",
    "min_p",
    "adaptive_p",
    "mirostat",
    "xtc",
    "encoder_repetition_penalty",
    "no_repeat_ngram",
]
KOBOLDCPP_ORDER = [6, 0, 1, 3, 4, 2, 5]
# src/constants.js: the keys the ST server keeps for the vllm and generic types
VLLM_KEYS = set(
    [
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "suffix",
        "temperature",
        "top_p",
        "user",
        "use_beam_search",
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "early_stopping",
        "stop_token_ids",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "include_stop_str_in_output",
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
    ]
)
OPENAI_KEYS = set(
    [
        "model",
        "prompt",
        "stream",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "stop",
        "seed",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "best_of",
    ]
)


def st_generation_data(
    api_type: str,
    server: RunningServer,
    *,
    n: int = 1,
    max_tokens: int = 24,
    seed: int = -1,
    token_probabilities: bool = False,
    stop: list[str] | None = None,
    prompt: str = STORY,
) -> dict[str, Any]:
    """createTextGenGenerationData() with the default settings (a normal generation, so
    multi-swipe applies), then what the ST server's /generate does to the body."""
    t = api_type
    stop = ["\nUser:"] if stop is None else stop
    breakers = json.dumps(json.loads(str(ST["dry_sequence_breakers"])), separators=(",", ":"))
    model = server.model_id if t in ("vllm", "aphrodite") else UNDEFINED  # from /v1/models
    maybe_seed = seed if seed >= 0 else UNDEFINED
    logprobs_n = (5 if t == "vllm" else 10) if token_probabilities else UNDEFINED
    only = {
        "ooba": lambda value: value if t == "ooba" else UNDEFINED,
        "tabby": lambda value: value if t == "tabby" else UNDEFINED,
    }
    params: dict[str, Any] = {
        "prompt": prompt,
        "model": model,
        "max_new_tokens": max_tokens,
        "max_tokens": max_tokens,
        "logprobs": logprobs_n,
        "temperature": ST["temp"],
        "top_p": ST["top_p"],
        "typical_p": ST["typical_p"],
        "typical": ST["typical_p"],
        "sampler_seed": maybe_seed,
        "min_p": ST["min_p"],
        "repetition_penalty": ST["rep_pen"],
        "frequency_penalty": ST["freq_pen"],
        "presence_penalty": ST["presence_pen"],
        "top_k": ST["top_k"],
        "skew": ST["skew"],
        "min_length": only["ooba"](ST["min_length"]),
        "min_tokens": ST["min_length"],
        "num_beams": only["ooba"](ST["num_beams"]),
        "length_penalty": only["ooba"](ST["length_penalty"]),
        "early_stopping": only["ooba"](ST["early_stopping"]),
        "add_bos_token": ST["add_bos_token"],
        "smoothing_factor": ST["smoothing_factor"],
        "smoothing_curve": ST["smoothing_curve"],
        "dry_allowed_length": ST["dry_allowed_length"],
        "dry_multiplier": ST["dry_multiplier"],
        "dry_base": ST["dry_base"],
        "dry_sequence_breakers": breakers,  # replaceMacrosInList: re-serialized
        "dry_penalty_last_n": ST["dry_penalty_last_n"],
        "max_tokens_second": ST["max_tokens_second"],
        "sampler_priority": only["ooba"](OOBA_ORDER),
        "samplers": LLAMACPP_ORDER if t == "llamacpp" else UNDEFINED,
        "stopping_strings": stop,
        "stop": stop,
        "truncation_length": 8192,
        "ban_eos_token": ST["ban_eos_token"],
        "skip_special_tokens": ST["skip_special_tokens"],
        "include_reasoning": ST["include_reasoning"],
        "top_a": ST["top_a"],
        "tfs": ST["tfs"],
        "epsilon_cutoff": only["ooba"](ST["epsilon_cutoff"]),
        "eta_cutoff": only["ooba"](ST["eta_cutoff"]),
        "mirostat_mode": ST["mirostat_mode"],
        "mirostat_tau": ST["mirostat_tau"],
        "mirostat_eta": ST["mirostat_eta"],
        "custom_token_bans": [] if t == "aphrodite" else "",
        "banned_strings": [],
        "api_type": t,
        "api_server": server.base_url + "/v1",
        "sampler_order": KOBOLDCPP_ORDER if t == "koboldcpp" else UNDEFINED,
        "xtc_threshold": ST["xtc_threshold"],
        "xtc_probability": ST["xtc_probability"],
        "nsigma": ST["nsigma"],
        "top_n_sigma": ST["nsigma"],
        "min_keep": ST["min_keep"],
        "adaptive_target": ST["adaptive_target"],
        "adaptive_decay": ST["adaptive_decay"],
    }
    if t == "koboldcpp":
        params.update(trim_stop=True, dry_sequence_breakers=json.loads(breakers))
    if t in ("tabby", "llamacpp"):
        params["n"] = n
    if t == "vllm":
        params.update(
            n=n,
            ignore_eos=ST["ignore_eos_token"],
            spaces_between_special_tokens=ST["spaces_between_special_tokens"],
            seed=maybe_seed,
        )
    elif t == "aphrodite":
        params.update(
            n=n,
            frequency_penalty=ST["freq_pen"],
            presence_penalty=ST["presence_pen"],
            repetition_penalty=ST["rep_pen"],
            seed=maybe_seed,
            stop=stop,
            temperature=ST["temp"],
            temperature_last=ST["temperature_last"],
            top_p=ST["top_p"],
            top_k=ST["top_k"],
            top_a=ST["top_a"],
            min_p=ST["min_p"],
            tfs=ST["tfs"],
            eta_cutoff=ST["eta_cutoff"],
            epsilon_cutoff=ST["epsilon_cutoff"],
            typical_p=ST["typical_p"],
            smoothing_factor=ST["smoothing_factor"],
            smoothing_curve=ST["smoothing_curve"],
            ignore_eos=ST["ignore_eos_token"],
            min_tokens=ST["min_length"],
            skip_special_tokens=ST["skip_special_tokens"],
            spaces_between_special_tokens=ST["spaces_between_special_tokens"],
            early_stopping=False,
            include_stop_str_in_output=False,
            xtc_threshold=ST["xtc_threshold"],
            xtc_probability=ST["xtc_probability"],
            nsigma=ST["nsigma"],
            custom_token_bans=[],
            no_repeat_ngram_size=ST["no_repeat_ngram_size"],
        )
    else:
        params.update(
            rep_pen=ST["rep_pen"],
            rep_pen_range=ST["rep_pen_range"],
            repetition_decay=only["tabby"](ST["rep_pen_decay"]),
            repetition_penalty_range=ST["rep_pen_range"],
            encoder_repetition_penalty=only["ooba"](ST["encoder_rep_pen"]),
            no_repeat_ngram_size=only["ooba"](ST["no_repeat_ngram_size"]),
            penalty_alpha=only["ooba"](ST["penalty_alpha"]),
            temperature_last=ST["temperature_last"] if t in ("ooba", "tabby") else UNDEFINED,
            speculative_ngram=only["tabby"](ST["speculative_ngram"]),
            do_sample=only["ooba"](ST["do_sample"]),
            seed=maybe_seed,
            guidance_scale=ST["guidance_scale"],
            negative_prompt=ST["negative_prompt"],
            grammar_string=ST["grammar_string"] or UNDEFINED,
            repeat_penalty=ST["rep_pen"],
            repeat_last_n=ST["rep_pen_range"],
            n_predict=max_tokens,
            num_predict=max_tokens,
            num_ctx=8192,
            mirostat=ST["mirostat_mode"],
            ignore_eos=ST["ban_eos_token"],
            n_probs=10 if token_probabilities else UNDEFINED,
            rep_pen_slope=ST["rep_pen_slope"],
        )
    if t == "llamacpp":
        params.update(
            logit_bias=[],
            grammar=ST["grammar_string"],
            cache_prompt=True,
            dry_sequence_breakers=json.loads(breakers),
        )
        params.pop("json_schema", None)
    body = {k: v for k, v in params.items() if v is not UNDEFINED}
    # text-completions.js /generate: only the vllm and generic bodies are filtered
    if t == "vllm":
        body = {k: v for k, v in body.items() if k in VLLM_KEYS}
    if t == "generic":
        body = {k: v for k, v in body.items() if k in OPENAI_KEYS}
        body["stop"] = body["stop"][:4]
    return body


@pytest.mark.parametrize("api_type", TEXTGEN_TYPES)
def test_sillytavern_connects(server: RunningServer, api_type: str) -> None:
    """text-completions.js /status: the models list (Tabby's own route for tabby), then
    Tabby's /v1/model or ooba's /v1/internal/model/info; the status shows the first id."""
    path = "/v1/model/list" if api_type == "tabby" else "/v1/models"
    models = httpx.get(server.base_url + path, headers={"Content-Type": "application/json"})
    assert models.status_code == 200
    data = models.json()["data"]
    assert isinstance(data, list)
    result = next(m["id"] for m in data) or "Valid"  # modelIds[0] || "Valid"
    if api_type == "tabby":
        info = httpx.get(server.base_url + "/v1/model")
        assert info.status_code == 200  # a 400 here shows "None"
        result = info.json()["id"] or result
    if api_type == "ooba":
        info = httpx.get(server.base_url + "/v1/internal/model/info")
        assert info.status_code == 200  # turns remote tokenization on
        result = info.json()["model_name"] or result
    assert result == server.model_id


def test_sillytavern_reads_llamacpp_props(server: RunningServer, model_facts: ModelFacts) -> None:
    """text-completions.js /props (llamacpp, ?model=): the ST server hashes `chat_template`
    (a string, or it answers 500) and the front end reads default_generation_settings.n_ctx."""
    response = httpx.get(f"{server.base_url}/props", params={"model": server.model_id})
    assert response.status_code == 200
    props = response.json()
    assert isinstance(props["chat_template"], str) and props["chat_template"]
    assert model_facts.turn_start in props["chat_template"]
    if model_facts.name == GEMMA:  # no template in its GGUF: its family's, shipped
        assert props["chat_template"] == packaged("gemma3.jinja")
    assert props["default_generation_settings"]["n_ctx"] == 8192
    assert isinstance(props["total_slots"], int) and props["total_slots"] >= 1
    assert props["model_path"].endswith(".gguf")


@pytest.mark.parametrize(
    ("api_type", "path", "body"),
    [
        ("llamacpp", "/tokenize", {"model": "", "content": STORY}),
        ("vllm", "/tokenize", {"model": SERVED, "prompt": STORY}),
        ("aphrodite", "/v1/tokenize", {"model": SERVED, "prompt": STORY}),
        (
            "tabby",
            "/v1/token/encode",
            {"text": STORY, "add_bos_token": False, "encode_special_tokens": False},
        ),
        ("ooba", "/v1/internal/encode", {"text": STORY}),
        ("koboldcpp", "/api/extra/tokencount", {"prompt": STORY, "special": False}),
    ],
)
def test_sillytavern_remote_tokenizer(
    server: RunningServer, api_type: str, path: str, body: dict
) -> None:
    """tokenizers.js /remote/textgenerationwebui/encode: the count is `length ?? count ??
    value ?? tokens.length`, the ids `tokens ?? ids`."""
    response = httpx.post(server.base_url + path, json=served(server, body))
    assert response.status_code == 200, response.text
    data = response.json()
    given = [data[k] for k in ("length", "count", "value") if data.get(k) is not None]
    count = given[0] if given else len(data["tokens"])
    ids = data.get("tokens") or data.get("ids") or []
    plain = httpx.post(f"{server.base_url}/tokenize", json={"content": STORY}).json()["tokens"]
    assert all(isinstance(t, int) for t in ids)
    assert count == len(ids) and ids[-len(plain) :] == plain
    assert len(ids) - len(plain) in (0, 1)  # a BOS where the dialect adds one


@pytest.mark.parametrize("api_type", TEXTGEN_TYPES)
def test_sillytavern_multi_swipe_streamed_and_not(server: RunningServer, api_type: str) -> None:
    """n=3 ("Multiple swipes per generation") where the type sends n, 1 otherwise; the
    streamed swipes, routed by index, equal the non-streamed ones (the seed is set)."""
    body = st_generation_data(api_type, server, n=3, seed=11)
    whole = st_textgen_whole(api_type, server, body)
    streamed = st_textgen_stream(api_type, server, body)
    swipes = 2 if api_type in SENDS_N else 0
    assert whole["text"] and len(whole["swipes"]) == swipes and all(whole["swipes"])
    assert streamed["text"] == whole["text"]
    assert streamed["swipes"] == whole["swipes"]
    assert "User:" not in whole["text"]  # the stop string never shows


@pytest.mark.parametrize("api_type", ["vllm", "aphrodite", "tabby", "koboldcpp"])
def test_sillytavern_token_probabilities_not_streamed(server: RunningServer, api_type: str) -> None:
    """parseAndSaveLogprobs → parseTabbyLogprobs: one `top_logprobs` dict per offset."""
    body = st_generation_data(api_type, server, token_probabilities=True, max_tokens=8)
    data = st_textgen_whole(api_type, server, body)["data"]
    parsed = st_parse_tabby_logprobs(api_type, data)
    assert parsed and all(p is not None and p["top"] for p in parsed)
    # The tokens cut out of the text at `text_offset` are the tokens generated.
    assert [p["token"] for p in parsed] == data["choices"][0]["logprobs"]["tokens"]
    k = 5 if api_type == "vllm" else 10
    assert all(k <= len(p["top"]) <= k + 1 for p in parsed)  # + the chosen token


@pytest.mark.parametrize("api_type", ["tabby", "ooba", "llamacpp"])
def test_sillytavern_token_probabilities_streamed(server: RunningServer, api_type: str) -> None:
    """parseTextgenLogprobs on each event: `logprobs.top_logprobs[0]` (a dict), or
    llama.cpp's `completion_probabilities[0].top_logprobs`."""
    body = st_generation_data(api_type, server, token_probabilities=True, max_tokens=8)
    out = st_textgen_stream(api_type, server, body)
    assert out["text"] and out["logprobs"]
    for entry in out["logprobs"]:
        top = entry["top"]
        assert len(top) >= 10 and all(isinstance(t, str) for t, _ in top)
        if api_type == "llamacpp":
            assert all(0 < p <= 1 for _, p in top)


def test_sillytavern_llamacpp_token_probabilities_not_streamed(server: RunningServer) -> None:
    """parseAndSaveLogprobs (llamacpp): completion_probabilities mapped one by one."""
    body = st_generation_data("llamacpp", server, token_probabilities=True, max_tokens=8)
    data = st_textgen_whole("llamacpp", server, body)["data"]
    parsed = [
        st_parse_textgen_logprobs("llamacpp", x.get("content"), [x])
        for x in data["completion_probabilities"]
    ]
    assert len(parsed) == data["tokens_predicted"] and all(p and p["top"] for p in parsed)


# -- SillyTavern's Custom (OpenAI-compatible) chat source ----------------------------------------


def st_custom_chat_body(model: str, n: int, stream: bool) -> dict[str, Any]:
    """openai.js createGenerationParameters (custom source, token probabilities on) as
    chat-completions.js forwards it: logprobs 5 becomes top_logprobs 5, logprobs true."""
    body = {
        "messages": [
            {"role": "system", "content": "Write the next reply in a fictional chat."},
            {"role": "user", "content": "Where does the lighthouse keeper live?"},
        ],
        "model": model,
        "temperature": 1,
        "max_tokens": 24,
        "stream": stream,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_p": 1,
        "seed": 5,
        "n": n,
        "logprobs": True,
        "top_logprobs": 5,
    }
    return body


# 'Bearer ' + an empty key; fetch strips a header value's trailing whitespace
CUSTOM_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer"}


def test_sillytavern_custom_chat_source_out_of_the_box(server: RunningServer) -> None:
    """The bundled base model chats with no setting changed; choices[0].message.content is
    the reply, choices[1..] the swipes, logprobs.content[] with top_logprobs each."""
    models = httpx.get(f"{server.api_url}/models", headers=CUSTOM_HEADERS)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == server.model_id
    response = httpx.post(
        f"{server.api_url}/chat/completions",
        json=st_custom_chat_body(server.model_id, 3, False),
        headers=CUSTOM_HEADERS,
        timeout=TIMEOUT,
    )
    assert response.status_code == 200, response.text
    data = response.json()
    assert "error" not in data
    texts = [c["message"]["content"] for c in data["choices"]]
    assert len(texts) == 3 and all(texts)
    content = data["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 5 for t in content)


def test_sillytavern_custom_chat_source_streamed_swipes(server: RunningServer) -> None:
    """sendOpenAIRequest streaming: choices[0].index > 0 goes to a swipe; the text is
    `delta.content ?? message.content ?? text`."""
    whole = httpx.post(
        f"{server.api_url}/chat/completions",
        json=st_custom_chat_body(server.model_id, 3, False),
        timeout=TIMEOUT,
    ).json()
    expected = [c["message"]["content"] for c in whole["choices"]]
    text, swipes = "", {}
    with httpx.stream(
        "POST",
        f"{server.api_url}/chat/completions",
        json=st_custom_chat_body(server.model_id, 3, True),
        headers=CUSTOM_HEADERS,
        timeout=TIMEOUT,
    ) as response:
        assert response.status_code == 200
        for value in st_events(response):
            if value == "[DONE]":
                break
            st_check_error(value)
            parsed = json.loads(value)
            choice = parsed["choices"][0]
            reply = choice.get("delta", {}).get("content")
            if reply is None:
                reply = (choice.get("message") or {}).get("content") or choice.get("text") or ""
            if choice["index"] > 0:
                swipes[choice["index"] - 1] = swipes.get(choice["index"] - 1, "") + reply
            else:
                text += reply
    assert [text, swipes[0], swipes[1]] == expected


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", {"prompt": STORY, "max_tokens": 8}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "Name a lighthouse."}]}),
    ],
)
def test_streams_carry_one_choice_per_chunk(server: RunningServer, path: str, body: dict) -> None:
    """SillyTavern reads only choices[0] of each event (sse-stream.js, and
    generateTextGenWithStreaming / sendOpenAIRequest): every chunk carries one choice, with
    its index and a string text (or delta); a usage chunk, when asked for, comes last."""
    body = {**body, "n": 3, "max_tokens": 8, "seed": 5, "stream": True}
    body["stream_options"] = {"include_usage": True}
    chunks = []
    with httpx.stream("POST", server.api_url + path, json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        for value in st_events(response):
            if value != "[DONE]":
                chunks.append(json.loads(value))
    *choices, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    assert all(len(c["choices"]) == 1 for c in choices)
    for chunk in choices:
        choice = chunk["choices"][0]
        assert choice["index"] in (0, 1, 2)
        text = choice["delta"].get("content", "") if "delta" in choice else choice["text"]
        assert isinstance(text, str)
    assert {c["choices"][0]["index"] for c in choices} == {0, 1, 2}


# == Mikupad ====================================================================================


def mikupad_events(response: httpx.Response) -> Iterator[dict]:
    """parseEventStream: line by line, `data:` JSON; [DONE] ends; error.message throws."""
    for line in response.iter_lines():
        if not line.startswith("data"):
            continue
        data = line.split(":", 1)[1].removeprefix(" ")
        if data == "[DONE]":
            break
        event = json.loads(data)
        assert not (event.get("error") or {}).get("message"), event
        yield event


def mikupad_llamacpp_tokens(chunks: Iterator[dict]) -> Iterator[dict]:
    """llamaCppCompletion's yieldTokens, then predict(): stopping_word replaces content."""
    for chunk in chunks:
        token = chunk.get("content") or chunk.get("token")
        choice = (chunk.get("completion_probabilities") or [None])[0]
        if choice and choice.get("top_probs"):  # post_sampling_probs: true
            probs = [{"tok_str": p["token"], "prob": p["prob"]} for p in choice["top_probs"]]
        elif choice and choice.get("probs") is not None:
            probs = choice["probs"]
        else:
            source = (choice or {}).get("top_logprobs") or chunk.get("top_logprobs") or {}
            values = source.values() if isinstance(source, dict) else source
            probs = [{"tok_str": p["token"], "prob": math.exp(p["logprob"])} for p in values]
        out = {"content": token, "probs": probs, "stopping_word": chunk.get("stopping_word")}
        if out["stopping_word"]:
            out["content"] = out["stopping_word"]
        yield out


def mikupad_llamacpp_body(prompt: str, **options: Any) -> dict[str, Any]:
    """predict() with the default preset in llama.cpp mode, as llamaCppCompletion sends it."""
    return {
        "model": "",
        "prompt": prompt,
        "temperature": 0.7,
        "repeat_penalty": 1.1,
        "repeat_last_n": 256,
        "penalize_nl": False,
        "ignore_eos": False,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": 0,
        "n_predict": -1,
        "n_probs": 10,
        "post_sampling_probs": False,
        "stream": True,
        **options,
        "cache_prompt": True,
    }


def mikupad_token_count(server: RunningServer, prompt: str) -> int:
    """llamaCppTokenCount, before every generation: a non-200 aborts predict()."""
    response = httpx.post(f"{server.base_url}/tokenize", json={"content": prompt})
    assert response.status_code == 200
    return len(response.json()["tokens"]) + 1


def test_mikupad_llamacpp_mode_streamed(server: RunningServer) -> None:
    assert mikupad_token_count(server, STORY) > 10
    body = mikupad_llamacpp_body(STORY, n_predict=16, seed=3, stop=["\n\n"])
    with httpx.stream("POST", f"{server.base_url}/completion", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        chunks = list(mikupad_llamacpp_tokens(mikupad_events(r)))
    shown = [c for c in chunks if c["content"]]  # predict() skips chunks without content
    assert shown and all(c["probs"] and 0 < c["probs"][0]["prob"] <= 1 for c in shown[:-1])
    whole = httpx.post(
        f"{server.base_url}/completion", json={**body, "stream": False}, timeout=TIMEOUT
    ).json()
    text = "".join(c["content"] for c in shown)
    assert text == whole["content"] + whole["stopping_word"]


def test_mikupad_llamacpp_mode_not_streamed_reads_only_probabilities(
    server: RunningServer,
) -> None:
    """Without token streaming Mikupad reads only `completion_probabilities`: each entry's
    `token` is the text, its `top_logprobs` the candidates."""
    body = mikupad_llamacpp_body(STORY, n_predict=8, stream=False, seed=2)
    response = httpx.post(f"{server.base_url}/completion", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    data = response.json()
    chunks = list(mikupad_llamacpp_tokens(iter(data["completion_probabilities"])))
    assert "".join(c["content"] for c in chunks) == data["content"]
    assert all(len(c["probs"]) == 10 for c in chunks)


def test_mikupad_llamacpp_post_sampling_probs(server: RunningServer) -> None:
    """post_sampling_probs (a Mikupad setting): `top_probs` with probabilities."""
    body = mikupad_llamacpp_body(STORY, n_predict=6, seed=2, post_sampling_probs=True)
    with httpx.stream("POST", f"{server.base_url}/completion", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        events = list(mikupad_events(r))
    entries = [e["completion_probabilities"][0] for e in events if not e["stop"]]
    assert entries and all(0 < e["prob"] <= 1 and "logprob" not in e for e in entries)
    chunks = [c for c in mikupad_llamacpp_tokens(iter(events)) if c["content"]]
    assert all(len(c["probs"]) == 10 and 0 < c["probs"][0]["prob"] <= 1 for c in chunks)


def test_mikupad_llamacpp_default_n_predict_streams_until_stopped(
    fresh_server: RunningServer,
) -> None:
    """The default preset sends n_predict -1 (no limit); Mikupad's Stop aborts the fetch.
    On a server of its own: how far the stream got when it was stopped depends on timing,
    and the module's server must run the same steps on every run (its seeded tests)."""
    body = mikupad_llamacpp_body(STORY, seed=1)
    url = f"{fresh_server.base_url}/completion"
    with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        events = mikupad_events(r)
        first = [next(events) for _ in range(5)]
    assert all(e["stop"] is False and isinstance(e["content"], str) for e in first)


def mikupad_openai_options(model: str, **options: Any) -> dict[str, Any]:
    """openaiConvertOptions on predict()'s options (DRY enabled, as the OpenAI-mode user of
    a Tabby or ooba server would): n_predict -1 becomes max_tokens 1024, n_probs logprobs,
    repeat_* repetition_*, mirostat mirostat_mode, ignore_eos ban_eos_token, and the DRY
    breakers stay a JSON string."""
    base = {
        "model": model,
        "prompt": STORY,
        "temperature": 0.7,
        "repetition_penalty": 1.1,
        "repetition_penalty_range": 256,
        "penalize_nl": False,
        "ban_eos_token": False,
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "mirostat_mode": 0,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": 0,
        "dry_multiplier": 0.8,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 1024,
        "dry_sequence_breakers": '["\\n", ":", "\\"", "*"]',
        "max_tokens": 1024,
        "logprobs": 10,
        "stream": True,
    }
    return {**base, **options}


MIKUPAD_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer"}  # `Bearer ${""}`


def test_mikupad_openai_mode_probes_and_streams(server: RunningServer) -> None:
    """getTokenCount tries Aphrodite's /v1/token/encode {prompt} first (`tokens.length` of
    the answer), getModels reads data[].id, then openaiCompletion streams choices[0].text
    with logprobs.top_logprobs[0]."""
    probe = httpx.post(
        f"{server.base_url}/v1/token/encode", json={"prompt": STORY}, headers=MIKUPAD_HEADERS
    )
    assert probe.status_code == 200 and probe.json()["length"] > 10
    models = httpx.get(f"{server.base_url}/v1/models", headers=MIKUPAD_HEADERS).json()
    assert [m["id"] for m in models["data"]] == [server.model_id]
    body = mikupad_openai_options(server.model_id, max_tokens=16, seed=4)
    tokens = []
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/completions",
        json=body,
        headers=MIKUPAD_HEADERS,
        timeout=TIMEOUT,
    ) as response:
        assert response.status_code == 200
        for chunk in mikupad_events(response):
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            top = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0]
            probs = [{"tok_str": t, "prob": math.exp(lp)} for t, lp in (top or {}).items()]
            tokens.append({"content": choice["text"], "probs": probs})
    shown = [t for t in tokens if t["content"]]
    assert shown and all(len(t["probs"]) >= 10 for t in shown)
    whole = httpx.post(
        f"{server.base_url}/v1/completions", json={**body, "stream": False}, timeout=TIMEOUT
    ).json()
    assert "".join(t["content"] for t in shown) == whole["choices"][0]["text"]


def test_mikupad_openai_mode_not_streamed(server: RunningServer) -> None:
    """openaiCompletion without streaming: with `logprobs.tokens`, one chunk per token
    with `top_logprobs[i]`."""
    body = mikupad_openai_options(server.model_id, max_tokens=8, seed=4, stream=False)
    data = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=TIMEOUT).json()
    logprobs = data["choices"][0]["logprobs"]
    chunks = [
        {"text": token, "top": logprobs["top_logprobs"][i]}
        for i, token in enumerate(logprobs["tokens"])
    ]
    assert "".join(c["text"] for c in chunks) == data["choices"][0]["text"]
    assert all(len(c["top"]) >= 10 for c in chunks)


def test_mikupad_chat_mode(server: RunningServer) -> None:
    """openaiChatCompletion: every event needs choices[0].delta (no usage-only chunk
    unless asked); tokens and top_logprobs from logprobs.content[0]."""
    body = {
        "model": server.model_id,
        "messages": [{"role": "user", "content": "Tell me about the lighthouse."}],
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 16,
        "logprobs": True,
        "top_logprobs": 10,
        "stream": True,
        "seed": 6,
    }
    text = ""
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        json=body,
        headers=MIKUPAD_HEADERS,
        timeout=TIMEOUT,
    ) as response:
        assert response.status_code == 200
        for chunk in mikupad_events(response):
            token = chunk["choices"][0]["delta"].get("content")
            top = ((chunk["choices"][0].get("logprobs") or {}).get("content") or [{}])[0]
            if token:
                assert len(top["top_logprobs"]) == 10
                text += token
    assert text


# == Loom =======================================================================================


def loom_format_response(response: dict, prompt: str) -> dict:
    """gpt.py format_openAI_response with echo: the prompt's tokens up to
    usage.prompt_tokens, each completion's text after the prompt and its token dicts."""
    prompt_end = response["usage"]["prompt_tokens"]

    def token_dict(completion: dict, token: str, i: int, offset: int) -> tuple[dict, int]:
        logprobs = completion["logprobs"]
        entry: dict[str, Any] = {
            "generatedToken": {"token": token, "logprob": logprobs["token_logprobs"][i]},
            "position": len(token) + offset,
        }
        if logprobs.get("top_logprobs"):
            alternatives = logprobs["top_logprobs"][i]
            if alternatives:
                entry["counterfactuals"] = dict(
                    sorted(alternatives.items(), key=lambda item: item[1], reverse=True)
                )
        else:
            entry["counterfactuals"] = None
        return entry, len(token) + offset

    first = response["choices"][0]
    prompt_tokens, offset = [], 0
    for i, token in enumerate(first["logprobs"]["tokens"][:prompt_end]):
        entry, offset = token_dict(first, token, i, offset)
        prompt_tokens.append(entry)
    completions = []
    for completion in response["choices"]:
        tokens, offset = [], len(prompt)
        for i, token in enumerate(completion["logprobs"]["tokens"][prompt_end:]):
            entry, offset = token_dict(completion, token, i + prompt_end, offset)
            tokens.append(entry)
        completions.append(
            {
                "text": completion["text"][len(prompt) :],
                "finishReason": completion["finish_reason"],
                "tokens": tokens,
            }
        )
    return {
        "completions": completions,
        "prompt": {"text": prompt, "tokens": prompt_tokens},
        "id": response["id"],
        "model": response["model"],
    }


def loom_generate(server: RunningServer, n: int) -> dict:
    """gpt.py openAI_generate (openai-custom type, DEFAULT_GENERATION_SETTINGS)."""
    client = openai.OpenAI(base_url=server.api_url, api_key="placeholder", max_retries=0)
    params = {
        "temperature": 0.9,
        "max_tokens": 24,
        "top_p": 1,
        "logprobs": 1,
        "logit_bias": {},
        "n": n,
        "stop": None,
        "model": server.model_id,
        "prompt": STORY,
        "echo": True,
    }
    return client.completions.create(**params).to_dict()  # type: ignore[call-overload]


def test_loom_echo_and_logprobs(server: RunningServer) -> None:
    response = loom_generate(server, 4)
    formatted = loom_format_response(response, STORY)
    prompt_tokens = formatted["prompt"]["tokens"]
    assert len(prompt_tokens) == response["usage"]["prompt_tokens"]
    assert "".join(t["generatedToken"]["token"] for t in prompt_tokens) == STORY
    assert prompt_tokens[0]["generatedToken"]["logprob"] is None  # the first has none
    assert len(formatted["completions"]) == 4
    for completion, choice in zip(formatted["completions"], response["choices"], strict=True):
        assert choice["text"].startswith(STORY)
        assert completion["finishReason"] in ("stop", "length")
        assert (
            "".join(t["generatedToken"]["token"] for t in completion["tokens"])
            == (completion["text"])
        )
        assert all(t["counterfactuals"] for t in completion["tokens"])


def test_loom_llama_cpp_type_sends_n_requests_of_one(server: RunningServer) -> None:
    """gpt.py generate: the llama-cpp type makes n calls with n=1 and joins the choices."""
    responses = [loom_generate(server, 1) for _ in range(2)]
    response = {**responses[-1], "choices": [r["choices"][0] for r in responses]}
    formatted = loom_format_response(response, STORY)
    assert [c["text"] for c in formatted["completions"]] == [
        c["text"][len(STORY) :] for c in response["choices"]
    ]


# == LangChain ==================================================================================


def test_langchain_prompt_list(server: RunningServer) -> None:
    """BaseOpenAI._generate: prompt is a list, the defaults are sent as they are (seed and
    logprobs null), `usage` must be there, and create_llm_result takes choices[i*n:(i+1)*n]
    as prompt i's generations."""
    prompts = ["The lighthouse keeper opened the door and", "Far out at sea, the boat"]
    n = 2
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
    response = client.completions.create(
        model=server.model_id,
        prompt=prompts,
        temperature=0.7,
        top_p=1,
        frequency_penalty=0,
        presence_penalty=0,
        n=n,
        logit_bias={},
        seed=None,
        logprobs=None,
        max_tokens=16,
    ).model_dump()
    assert not response.get("error")
    usage = response["usage"]
    assert {"completion_tokens", "prompt_tokens", "total_tokens"} <= set(usage)
    choices = response["choices"]
    assert [c["index"] for c in choices] == list(range(len(prompts) * n))
    generations = [choices[i * n : (i + 1) * n] for i in range(len(prompts))]
    assert all(len(g) == n for g in generations)
    assert all(c["finish_reason"] in ("stop", "length") for c in choices)


# == the dialects' fields, each at a non-default value ============================================


def native(server: RunningServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/completion", json=body, timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("alias", "value", "canonical"),
    [
        ("repetition_penalty", 1.3, "repeat_penalty"),
        ("rep_pen", 1.4, "repeat_penalty"),
        ("repetition_penalty_range", 128, "repeat_last_n"),
        ("rep_pen_range", 96, "repeat_last_n"),
        ("typical", 0.9, "typical_p"),
        ("mirostat_mode", 2, "mirostat"),
        ("nsigma", 1.5, "top_n_sigma"),
        ("ban_eos_token", True, "ignore_eos"),
        ("grammar_string", 'root ::= "a"', "grammar"),
        ("sampler_seed", 77, "seed"),
        ("stopping_strings", ["\n\n"], "stop"),
        ("min_length", 1, "min_tokens"),
        ("max_new_tokens", 2, "n_predict"),
        ("max_tokens", 3, "n_predict"),
        ("num_predict", 1, "n_predict"),
        ("max_completion_tokens", 2, "n_predict"),
        ("logprobs", 2, "n_probs"),
        ("n_cmpl", 2, "n"),
    ],
)
def test_each_alias_reaches_its_setting(
    server: RunningServer, alias: str, value: Any, canonical: str
) -> None:
    """Read back from /completion's generation_settings; the same table serves
    /v1/completions and chat (api/schemas/dialects.py)."""
    body = {"prompt": "Once", "n_predict": 1, alias: value}
    if canonical == "n_predict":
        del body["n_predict"]
    response = native(server, **body)
    assert response.status_code == 200, response.text
    data = response.json()
    results = data if isinstance(data, list) else [data]
    assert results[0]["generation_settings"][canonical] == value
    completions = httpx.post(
        f"{server.api_url}/completions",
        json={"prompt": "Once", "max_tokens": 1, alias: value},
        timeout=TIMEOUT,
    )
    assert completions.status_code == 200, completions.text


def test_the_canonical_name_wins_over_its_alias(server: RunningServer) -> None:
    body = {"prompt": "Once", "n_predict": 1, "repeat_penalty": 1.1, "repetition_penalty": 1.5}
    assert native(server, **body).json()["generation_settings"]["repeat_penalty"] == 1.1
    out = httpx.post(
        f"{server.api_url}/completions",
        json={"prompt": "Once", "max_tokens": 2, "max_new_tokens": 5, "ignore_eos": True},
        timeout=TIMEOUT,
    ).json()
    assert out["usage"]["completion_tokens"] == 2


def test_dry_breakers_as_a_json_string_and_top_n_sigma_0_is_off(server: RunningServer) -> None:
    body = {
        "prompt": STORY,
        "n_predict": 4,
        "dry_multiplier": 0.8,
        "dry_sequence_breakers": '["\\n", ":"]',
        "top_n_sigma": 0,
        "logit_bias": [],
    }
    settings = native(server, **body).json()["generation_settings"]
    assert settings["dry_sequence_breakers"] == ["\n", ":"] and settings["top_n_sigma"] == 0
    out = httpx.post(
        f"{server.api_url}/completions",
        json={**body, "max_tokens": 4, "dry_sequence_breakers": '"\\n", ":"'},
        timeout=TIMEOUT,
    )
    assert out.status_code == 200, out.text


def test_logit_bias_in_llama_cpps_list_form(server: RunningServer) -> None:
    greedy = native(server, prompt=STORY, n_predict=1, temperature=0, return_tokens=True).json()
    first = greedy["tokens"][0]
    for bias in ([[first, False]], [[greedy["content"], False]], {str(first): -100}):
        out = native(
            server, prompt=STORY, n_predict=1, temperature=0, return_tokens=True, logit_bias=bias
        ).json()
        assert out["tokens"][0] != first, bias


def test_samplers_choose_the_chain(server: RunningServer) -> None:
    settings = native(
        server, prompt="Once", n_predict=1, top_k=20, min_p=0.2, samplers=["top_p", "temperature"]
    ).json()["generation_settings"]
    assert (settings["top_k"], settings["min_p"]) == (0, 0.0)  # left out: off
    assert settings["samplers"] == ["top_p", "temperature"]
    letters = native(server, prompt="Once", n_predict=1, samplers="kt").json()
    assert letters["generation_settings"]["top_p"] == 1.0


def test_samplers_order_the_chain(server: RunningServer) -> None:
    """llama-server applies `samplers` in the order given (tools/server/README.md): min-p
    before a high temperature keeps only the tokens near the top of the model's own
    distribution; after it, the flattened distribution lets more through."""
    probs = native(server, prompt=STORY, n_predict=1, temperature=0, n_probs=20).json()
    top = probs["completion_probabilities"][0]["top_logprobs"]
    best = max(t["logprob"] for t in top)
    near = {t["id"] for t in top if t["logprob"] >= best + math.log(0.3)}
    body = {"prompt": STORY, "n_predict": 1, "n": 12, "seed": 5, "return_tokens": True}
    body |= {"min_p": 0.3, "temperature": 4.0}

    def first_tokens(samplers: list[str]) -> set[int]:
        results = native(server, **body, samplers=samplers).json()
        return {r["tokens"][0] for r in results}

    assert first_tokens(["min_p", "temperature"]) <= near
    assert first_tokens(["temperature", "min_p"]) - near


def test_completion_options(server: RunningServer) -> None:
    """cache_prompt false is accepted; return_tokens gives the ids; n_probs the
    probabilities; a prompt of token ids; /completions is the same route."""
    ids = httpx.post(f"{server.base_url}/tokenize", json={"content": STORY, "add_special": True})
    body = {
        "prompt": ids.json()["tokens"],
        "n_predict": 4,
        "cache_prompt": False,
        "return_tokens": True,
        "n_probs": 3,
        "ignore_eos": True,
        "seed": 9,
    }
    out = httpx.post(f"{server.base_url}/completions", json=body, timeout=TIMEOUT).json()
    assert len(out["tokens"]) == out["tokens_predicted"] == 4
    assert out["stop_type"] == "limit" and out["stopping_word"] == ""
    assert out["tokens_evaluated"] == len(body["prompt"])
    detok = httpx.post(f"{server.base_url}/detokenize", json={"tokens": out["tokens"]})
    assert detok.json()["content"] == out["content"]
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"]
    assert all(len(p["top_logprobs"]) == 3 and p["logprob"] <= 0 for p in probs)
    timings = out["timings"]
    assert timings["predicted_n"] == 4 and timings["prompt_n"] + timings["cache_n"] == len(
        body["prompt"]
    )


def test_native_stream_shape(server: RunningServer) -> None:
    """llama-server's events: content, tokens, stop false per token; then per result one
    with stop true, stop_type, stopping_word, tokens_predicted, tokens_evaluated, timings."""
    body = {"prompt": STORY, "n_predict": 6, "n": 2, "stream": True, "seed": 4, "n_probs": 2}
    events: list[dict] = []
    with httpx.stream("POST", f"{server.base_url}/completion", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            assert line.startswith("data: ") or not line
            if line:
                events.append(json.loads(line.removeprefix("data: ")))
    for index in (0, 1):
        mine = [e for e in events if e["index"] == index]
        *tokens, final = mine
        assert all(e["stop"] is False and len(e["tokens"]) == 1 for e in tokens)
        assert all(len(e["completion_probabilities"]) == 1 for e in tokens)
        assert final["stop"] is True and final["content"] == ""
        assert final["stop_type"] in ("eos", "limit") and final["stopping_word"] == ""
        assert final["tokens_predicted"] == len(tokens)
        assert final["tokens_evaluated"] > 10
        assert {"prompt_n", "predicted_n", "predicted_per_second"} <= set(final["timings"])


def test_native_stop_word(server: RunningServer) -> None:
    """A stop string ends a result with stop_type "word" and names it in stopping_word."""
    greedy = native(server, prompt=STORY, n_predict=12, temperature=0).json()["content"]
    word = greedy.strip().split()[1]
    out = native(server, prompt=STORY, n_predict=12, temperature=0, stop=["zzz", word]).json()
    assert out["stop_type"] == "word" and out["stopping_word"] == word
    assert greedy.startswith(out["content"]) and word not in out["content"]


def test_unknown_sampler_names_are_skipped_as_llama_cpp_skips_them(
    server: RunningServer,
) -> None:
    """SillyTavern 1.12.6's default `samplers` (common/sampling.cpp: llama-server logs
    `tfs_z` and `typical_p` and goes on), and a letter string with an unknown letter."""
    for samplers in (["top_k", "tfs_z", "typical_p", "top_p", "min_p", "temperature"], "kzt"):
        response = native(server, prompt=STORY, n_predict=4, samplers=samplers)
        assert response.status_code == 200, response.text
    assert "skipping unknown sampler names ['tfs_z', 'typical_p']" in server.log()


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completion", {"prompt": "x", "samplers": ["top_k"] * 65}, "samplers"),
        ("/completion", {"prompt": "x", "n_probs": 21}, "n_probs"),
        ("/completion", {"prompt": "x", "n_predict": -2}, "n_predict"),
        ("/completion", {"prompt": "x", "n_predict": 10**6}, "max_tokens"),
        ("/completion", {"prompt": [1, "x"]}, "prompt"),
        ("/completion", {"prompt": "x", "n": 0}, "n"),
        ("/completion", {"prompt": "x", "max_new_tokens": -3}, "n_predict"),
        ("/v1/completions", {"prompt": "x", "dry_sequence_breakers": "[1, 2]"}, None),
        ("/v1/completions", {"prompt": "x", "dry_sequence_breakers": "nope["}, None),
        ("/v1/completions", {"prompt": "x", "logit_bias": [[1]]}, "logit_bias"),
        ("/v1/completions", {"prompt": "x", "logit_bias": [[1, "x"]]}, "logit_bias"),
        ("/v1/completions", {"prompt": "x", "logit_bias": [[10**9, 1]]}, "logit_bias"),
        ("/v1/completions", {"prompt": "x", "repetition_penalty": 11}, "repeat_penalty"),
        ("/v1/completions", {"prompt": "x", "mirostat_mode": 3}, "mirostat"),
        ("/v1/completions", {"prompt": "x", "max_new_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "typical": "high"}, "typical_p"),
        ("/tokenize", {"model": SERVED}, None),
        ("/v1/token/encode", {"add_bos_token": False}, None),
        ("/v1/token/decode", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_bad_dialect_values_are_openai_style_400s(
    server: RunningServer, path: str, body: dict, param: str | None
) -> None:
    response = httpx.post(server.base_url + path, json=served(server, body), timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_tokenizer_dialect_options(server: RunningServer, model_facts: ModelFacts) -> None:
    """vLLM's add_special_tokens, Tabby's add_bos_token and decode, ooba's token count (a
    BOS added by default where the model wants one: Gemma 3, not SmolLM2)."""
    bos = int(model_facts.add_bos)
    plain = httpx.post(f"{server.base_url}/tokenize", json={"content": "Hi"}).json()["tokens"]
    vllm = httpx.post(
        f"{server.base_url}/tokenize", json={"prompt": "Hi", "add_special_tokens": False}
    ).json()
    assert vllm["tokens"] == plain and vllm["count"] == len(plain) and vllm["max_model_len"] == 8192
    tabby = httpx.post(f"{server.base_url}/v1/token/encode", json={"text": "Hi"}).json()
    assert tabby["tokens"][bos:] == plain and tabby["length"] == len(plain) + bos
    literal = httpx.post(
        f"{server.base_url}/v1/token/encode",
        json={
            "text": model_facts.turn_start,
            "add_bos_token": False,
            "encode_special_tokens": False,
        },
    ).json()
    assert literal["length"] > 1
    text = httpx.post(f"{server.base_url}/v1/token/decode", json={"tokens": plain}).json()["text"]
    assert text == "Hi"
    count = httpx.post(f"{server.base_url}/v1/internal/token-count", json={"text": "Hi"}).json()
    assert count == {"length": len(plain) + bos}
    decoded = httpx.post(f"{server.base_url}/v1/internal/decode", json={"tokens": plain}).json()
    assert decoded == {"text": "Hi"}

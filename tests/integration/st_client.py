"""SillyTavern's side of a text completion, ported from its source: where its server
forwards a request (src/endpoints/backends/text-completions.js /generate), and how its page
reads the answer: public/script.js (extractMessageFromData, extractMultiSwipes),
public/scripts/sse-stream.js (EventSourceStream), public/scripts/textgen-settings.js
(generateTextGenWithStreaming, tryParseStreamingError, parseTextgenLogprobs,
parseTabbyLogprobs). Shared by test_client_compat.py and test_sillytavern_presets.py."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import httpx

from tests.support.server import RunningServer

TIMEOUT = 180


def st_generate_url(api_type: str, server: RunningServer) -> str:
    """text-completions.js /generate: trimV1(api_server) + the type's path."""
    return server.base_url + ("/completion" if api_type == "llamacpp" else "/v1/completions")


def st_events(response: httpx.Response) -> Iterator[str]:
    """sse-stream.js EventSourceStream: events split on blank lines, `data:` lines joined."""
    buffer = ""
    for chunk in response.iter_text():
        buffer += chunk
        *events, buffer = re.split(r"\r\n\r\n|\r\r|\n\n", buffer)
        for event in events:
            data = [
                m.group(2) or ""
                for line in re.split(r"\n|\r|\r\n", event)
                if (m := re.match(r"([^:]+)(?:: ?(.*))?", line)) and m.group(1) == "data"
            ]
            if data:
                yield "\n".join(data)


def st_check_error(data: str) -> None:
    """tryParseStreamingError: a top-level error.message, error, message or detail aborts."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return
    if isinstance(parsed, dict):
        error = parsed.get("error")
        message = (error.get("message") if isinstance(error, dict) else error) or parsed.get(
            "message"
        )
        assert not (message or parsed.get("detail")), f"SillyTavern shows an error: {data}"


def st_textgen_stream(
    api_type: str, server: RunningServer, body: dict[str, Any], key: str | None = None
) -> dict:
    """generateTextGenWithStreaming: the main text, the swipes, and the logprobs of each
    main-text event that had some (what the streaming processor keeps). With `key`, the
    headers its server sends the type's key in (src/additional-headers.js: getTabbyHeaders,
    getLlamaCppHeaders)."""
    text, swipes, logprobs = "", {}, []
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if key and api_type == "tabby":
        headers["x-api-key"] = key
    url = st_generate_url(api_type, server)
    with httpx.stream(
        "POST", url, json={**body, "stream": True}, headers=headers, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200, response.read()
        for value in st_events(response):
            if value == "[DONE]":
                break
            st_check_error(value)
            data = json.loads(value)
            choice = (data.get("choices") or [{}])[0]
            if choice.get("index", 0) > 0:
                i = choice["index"] - 1
                swipes[i] = swipes.get(i, "") + js_str(choice.get("text"))
            elif data.get("index", 0) > 0:  # llama.cpp streaming swipe
                i = data["index"] - 1
                swipes[i] = swipes.get(i, "") + js_str(data.get("content"))
            else:
                new_text = choice.get("text") or data.get("content") or ""
                text += new_text
                raw = choice.get("logprobs") or data.get("completion_probabilities")
                parsed = st_parse_textgen_logprobs(api_type, new_text, raw)
                if parsed is not None:
                    logprobs.append(parsed)
    return {"text": text, "swipes": [swipes[i] for i in sorted(swipes)], "logprobs": logprobs}


def js_str(value: object) -> str:
    """`+=` in JavaScript: a missing text becomes the string "undefined"."""
    return "undefined" if value is None else str(value)


def st_textgen_whole(api_type: str, server: RunningServer, body: dict[str, Any]) -> dict:
    """A non-streamed generation: extractMessageFromData and extractMultiSwipes."""
    response = httpx.post(st_generate_url(api_type, server), json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    data = response.json()
    if isinstance(data, dict):
        choice = (data.get("choices") or [{}])[0]
        text = choice.get("text") or data.get("content") or ""
    else:
        text = data[0]["content"]
    swipes: list[str] = []
    if api_type == "llamacpp" and isinstance(data, list):
        swipes = [r.get("content") or "" for r in data[1:]]
    if api_type in ("vllm", "aphrodite", "tabby"):
        swipes = [(c.get("message") or {}).get("content") or c["text"] for c in data["choices"][1:]]
    return {"text": text, "swipes": swipes, "data": data}


def st_parse_textgen_logprobs(api_type: str, token: str, logprobs: Any) -> Any:
    """parseTextgenLogprobs: one token's candidates as [text, probability or logprob]."""
    if not logprobs:
        return None
    if api_type == "llamacpp":
        first = logprobs[0]
        if "probs" in first:
            return {"token": token, "top": [[x["tok_str"], x["prob"]] for x in first["probs"]]}
        if first.get("top_logprobs"):
            top = [[x["token"], math.exp(x["logprob"])] for x in first["top_logprobs"]]
            return {"token": token, "top": top}
        return None
    top_logprobs = logprobs.get("top_logprobs")
    if not top_logprobs:
        return None
    return {"token": token, "top": list(top_logprobs[0].items())}  # Object.entries: a dict


def st_parse_tabby_logprobs(api_type: str, data: dict) -> list | None:
    """parseTabbyLogprobs (vllm, aphrodite, tabby, koboldcpp): tokens cut from the text at
    `text_offset`, each with its `top_logprobs` dict."""
    choice = data["choices"][0]
    text, offsets = choice.get("text"), (choice.get("logprobs") or {}).get("text_offset")
    if not text or not offsets:
        return None
    tokens = [
        text[o : (offsets[i + 1] if i + 1 < len(offsets) else 0) or len(text)]
        for i, o in enumerate(offsets)
    ]
    tops = [{"top_logprobs": [x]} for x in choice["logprobs"]["top_logprobs"]]
    return [st_parse_textgen_logprobs(api_type, t, tops[i]) for i, t in enumerate(tokens)]

"""Streams parsed the way real clients parse them.

SillyTavern reads only `choices[0]` of each SSE event and routes it by its `index` to a
swipe (`public/scripts/textgen-settings.js`, `generateTextGenWithStreaming`: index > 0
appends `choices[0].text` to swipe index - 1, anything else to the main text; the chat
source in `public/scripts/openai.js` does the same with `delta.content`). So a stream
with n > 1 must carry one choice per chunk, each with its index and a string text.
"""

from __future__ import annotations

import json

import httpx

from llama_srb.testing import RunningServer

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"


def sillytavern_stream(server: RunningServer, path: str, body: dict) -> list[str]:
    """The main text and the swipes, as SillyTavern assembles them from the events."""
    main, swipes = "", [""] * (body["n"] - 1)
    with httpx.stream(
        "POST", f"{server.api_url}{path}", json={**body, "stream": True}, timeout=120
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: ") :])
            if not data["choices"]:  # the usage chunk
                continue
            assert len(data["choices"]) == 1, data  # anything past choices[0] is lost
            choice = data["choices"][0]
            text = choice["delta"].get("content") or "" if "delta" in choice else choice["text"]
            assert isinstance(text, str)
            if choice["index"] > 0:
                swipes[choice["index"] - 1] += text
            else:
                main += text
    return [main, *swipes]


def test_sillytavern_multi_swipe_text_stream_gets_every_swipe(server: RunningServer) -> None:
    body = {"prompt": STORY, "n": 3, "max_tokens": 12, "seed": 11}
    whole = httpx.post(f"{server.api_url}/completions", json=body, timeout=120).json()
    expected = [c["text"] for c in whole["choices"]]
    assert all(expected)
    assert sillytavern_stream(server, "/completions", body) == expected


def test_sillytavern_multi_swipe_chat_stream_gets_every_swipe(
    chat_server: RunningServer,
) -> None:
    body = {
        "messages": [{"role": "user", "content": "Name a lighthouse."}],
        "n": 3,
        "max_tokens": 10,
        "seed": 5,
        "stream_options": {"include_usage": True},
    }
    whole = httpx.post(f"{chat_server.api_url}/chat/completions", json=body, timeout=120)
    expected = [c["message"]["content"] for c in whole.json()["choices"]]
    assert all(expected)
    assert sillytavern_stream(chat_server, "/chat/completions", body) == expected

"""Helpers the integration tests share: one place for each way of calling the server."""

from __future__ import annotations

import json

import httpx

from tests.support.server import RunningServer


def complete(server: RunningServer, **body: object) -> dict:
    """POST /v1/completions with `body`; the parsed answer, which must be a 200."""
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def stream(url: str, body: dict, headers: dict[str, str] | None = None) -> list[dict | str]:
    """POST `body` to `url` and read its server-sent events: each `data:` payload parsed
    (the `[DONE]` that ends OpenAI's streams kept as the string)."""
    events: list[dict | str] = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events

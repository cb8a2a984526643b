"""Helpers the integration tests share: one place for each way of calling the server."""

from __future__ import annotations

import httpx

from llama_srb.testing import RunningServer


def complete(server: RunningServer, **body: object) -> dict:
    """POST /v1/completions with `body`; the parsed answer, which must be a 200."""
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()

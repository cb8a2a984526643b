"""POST /tokenize and /detokenize, at the root as llama.cpp's server has them, and under /v1."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.bundled import ModelFacts
from tests.support.server import RunningServer


def text_with_a_special_token(facts: ModelFacts) -> str:
    return f"Hello {facts.turn_start}world, café ☕"


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_round_trip(server: RunningServer, model_facts: ModelFacts, prefix: str) -> None:
    base = server.base_url + prefix
    text = text_with_a_special_token(model_facts)
    tokens = httpx.post(f"{base}/tokenize", json={"content": text}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    back = httpx.post(f"{base}/detokenize", json={"tokens": tokens}).json()["content"]
    assert back == text


def test_special_tokens_and_pieces(server: RunningServer, model_facts: ModelFacts) -> None:
    """add_special adds a BOS only where the model wants one (Gemma 3, not SmolLM2)."""
    url = f"{server.base_url}/tokenize"
    plain = httpx.post(url, json={"content": "Hi"}).json()["tokens"]
    with_bos = httpx.post(url, json={"content": "Hi", "add_special": True}).json()["tokens"]
    assert with_bos[-len(plain) :] == plain
    assert len(with_bos) == len(plain) + model_facts.add_bos
    text = text_with_a_special_token(model_facts)
    pieces = httpx.post(url, json={"content": text, "with_pieces": True}).json()["tokens"]
    assert model_facts.turn_start in [p["piece"] for p in pieces]  # one special token
    literal = httpx.post(url, json={"content": text, "parse_special": False}).json()["tokens"]
    assert len(literal) > len(pieces)  # spelled out as ordinary text


def test_bad_token_ids_are_a_400(server: RunningServer) -> None:
    response = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [1, 10**9]})
    assert response.status_code == 400
    assert "not in the vocabulary" in response.json()["error"]["message"]

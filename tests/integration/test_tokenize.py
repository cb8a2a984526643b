"""POST /tokenize and /detokenize, at the root as llama.cpp's server has them, and under /v1."""

from __future__ import annotations

import httpx
import pytest

from llama_srb.testing import RunningServer

TEXT = "Hello <start_of_turn>world, café ☕"


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_round_trip(server: RunningServer, prefix: str) -> None:
    base = server.base_url + prefix
    tokens = httpx.post(f"{base}/tokenize", json={"content": TEXT}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    text = httpx.post(f"{base}/detokenize", json={"tokens": tokens}).json()["content"]
    assert text == TEXT


def test_special_tokens_and_pieces(server: RunningServer) -> None:
    url = f"{server.base_url}/tokenize"
    plain = httpx.post(url, json={"content": "Hi"}).json()["tokens"]
    with_bos = httpx.post(url, json={"content": "Hi", "add_special": True}).json()["tokens"]
    assert with_bos[1:] == plain and len(with_bos) == len(plain) + 1
    pieces = httpx.post(url, json={"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert "<start_of_turn>" in [p["piece"] for p in pieces]  # one special token
    literal = httpx.post(url, json={"content": TEXT, "parse_special": False}).json()["tokens"]
    assert len(literal) > len(pieces)  # spelled out as ordinary text


def test_bad_token_ids_are_a_400(server: RunningServer) -> None:
    response = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [1, 10**9]})
    assert response.status_code == 400
    assert "not in the vocabulary" in response.json()["error"]["message"]

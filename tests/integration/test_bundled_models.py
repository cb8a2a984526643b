"""What differs between the bundled models, checked on each: the vocabulary's size, the
end-of-generation tokens, and a BOS token only where the model asks for one."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.integration.bundled import ModelFacts
from tests.support.server import RunningServer


def post(server: RunningServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120)


def token_id(server: RunningServer, special: str) -> int:
    tokens = post(server, "/tokenize", {"content": special})
    assert tokens.status_code == 200, tokens.text
    (token,) = tokens.json()["tokens"]  # one special token
    return int(token)


def test_the_models_own_facts_are_what_the_server_reports(
    server: RunningServer, model_facts: ModelFacts
) -> None:
    props = httpx.get(f"{server.base_url}/props").json()
    assert props["model_path"].endswith(".gguf")
    assert token_id(server, model_facts.end_of_turn) != token_id(server, model_facts.end_of_text)
    last = model_facts.n_vocab - 1
    assert post(server, "/detokenize", {"tokens": [last]}).status_code == 200


@pytest.mark.parametrize(
    ("path", "body_of"),
    [
        ("/detokenize", lambda t: {"tokens": [5, t]}),
        ("/v1/completions", lambda t: {"prompt": [5, t], "max_tokens": 1}),
        ("/v1/completions", lambda t: {"prompt": "a", "max_tokens": 1, "logit_bias": {str(t): 1}}),
        ("/completion", lambda t: {"prompt": "a", "n_predict": 1, "logit_bias": [[t, 1.0]]}),
    ],
)
def test_the_first_id_past_the_vocabulary_is_a_400_and_the_last_one_is_served(
    server: RunningServer, model_facts: ModelFacts, path: str, body_of: Callable[[int], dict]
) -> None:
    """Gemma 3 has 262,144 tokens, SmolLM2 49,152: each server bounds ids by its own."""
    past, last = model_facts.n_vocab, model_facts.n_vocab - 1
    refused = post(server, path, body_of(past))
    assert refused.status_code == 400, refused.text
    assert f"[0, {model_facts.n_vocab})" in refused.json()["error"]["message"]
    served = post(server, path, body_of(last))
    assert served.status_code == 200, served.text


def test_top_k_is_bounded_by_the_vocabulary(server: RunningServer, model_facts: ModelFacts) -> None:
    body = {"prompt": "a", "max_tokens": 2, "top_k": model_facts.n_vocab}
    assert post(server, "/v1/completions", body).status_code == 200
    refused = post(server, "/v1/completions", {**body, "top_k": model_facts.n_vocab + 1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_k"


@pytest.mark.parametrize("which", ["end_of_text", "end_of_turn"])
def test_each_end_of_generation_token_ends_a_completion_unseen(
    server: RunningServer, model_facts: ModelFacts, which: str
) -> None:
    """The base text's end and the chat turn's end both end a plain completion with
    `stop` and are never shown; with ignore_eos they are not sampled at all."""
    end = getattr(model_facts, which)
    bias = {str(token_id(server, end)): 100}
    body = {"prompt": "The sea", "n": 2, "max_tokens": 8, "logit_bias": bias, "min_tokens": 2}
    out = post(server, "/v1/completions", body).json()
    assert [c["finish_reason"] for c in out["choices"]] == ["stop", "stop"]
    assert all(c["text"] and end not in c["text"] for c in out["choices"])
    assert out["usage"]["completion_tokens"] == 4  # 2 each, the end unseen
    kept_going = post(server, "/v1/completions", {**body, "ignore_eos": True}).json()
    assert [c["finish_reason"] for c in kept_going["choices"]] == ["length", "length"]


def test_a_prompt_gets_a_bos_only_where_the_model_wants_one(
    server: RunningServer, model_facts: ModelFacts
) -> None:
    """Gemma 3 asks for a BOS, SmolLM2 not (its `bos` is <|im_start|>, which a text
    prompt must not gain): text, token-id and chat prompts count the same tokens."""
    text = "The lighthouse keeper climbed the stairs."
    plain = post(server, "/tokenize", {"content": text}).json()["tokens"]
    body = {"max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    by_text = post(server, "/v1/completions", {**body, "prompt": text}).json()
    assert by_text["usage"]["prompt_tokens"] == len(plain) + model_facts.add_bos
    assert by_text["choices"][0]["text"].startswith(text)  # no BOS or marker shown
    messages = [{"role": "user", "content": text}]
    chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    rendered = model_facts.chat_prompt(text)
    rendered_tokens = post(server, "/tokenize", {"content": rendered}).json()["tokens"]
    assert chat["usage"]["prompt_tokens"] == len(rendered_tokens) + model_facts.add_bos

"""Constrained output (JSON, JSON schemas, GBNF) in every one of n choices, and logit_bias."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.server import RunningServer

SCHEMA = {
    "type": "object",
    "properties": {"mood": {"enum": ["calm", "stormy"]}, "lit": {"type": "boolean"}},
    "required": ["mood", "lit"],
    "additionalProperties": False,
}
PROMPT = "The lighthouse, described as JSON:"


def post(server: RunningServer, path: str, **body: object) -> httpx.Response:
    return httpx.post(f"{server.api_url}{path}", json=body, timeout=120)


def assert_matches_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"mood", "lit"}
    assert value["mood"] in ("calm", "stormy") and isinstance(value["lit"], bool)


def test_chat_json_schema_in_all_n_choices(chat_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=chat_server.api_url, api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=chat_server.model_id,
        messages=[{"role": "user", "content": "Describe the lighthouse as JSON."}],
        n=3,
        max_tokens=40,  # the grammar ends it (~20 tokens); room for its optional spaces
        seed=11,
        response_format={"type": "json_schema", "json_schema": {"name": "l", "schema": SCHEMA}},
    )
    assert len(out.choices) == 3
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        assert_matches_schema(choice.message.content or "")


def test_completions_json_schema_streaming_in_all_n_choices(server: RunningServer) -> None:
    body = {
        "prompt": PROMPT,
        "n": 3,
        "max_tokens": 40,
        "temperature": 1.0,
        "seed": 3,
        "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
    }
    texts = {0: "", 1: "", 2: ""}
    with httpx.stream("POST", f"{server.api_url}/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] += c["text"]
    for text in texts.values():
        assert_matches_schema(text)


def test_json_object_is_json_from_the_first_character(server: RunningServer) -> None:
    out = post(
        server,
        "/completions",
        prompt=PROMPT,
        n=2,
        max_tokens=16,
        seed=1,
        response_format={"type": "json_object"},
    ).json()
    for choice in out["choices"]:
        assert choice["text"].startswith("{")
        if choice["finish_reason"] == "stop":  # complete: the grammar allowed the end
            assert isinstance(json.loads(choice["text"]), dict)


def test_gbnf_grammar_in_all_n_choices(server: RunningServer) -> None:
    out = post(
        server,
        "/completions",
        prompt="Is the lamp lit? Answer:",
        n=3,
        max_tokens=4,
        seed=2,
        grammar='root ::= " yes" | " no"',
    ).json()
    for choice in out["choices"]:
        assert choice["text"] in (" yes", " no") and choice["finish_reason"] == "stop"


def test_logit_bias_minus_100_changes_the_greedy_token(server: RunningServer) -> None:
    first = post(server, "/completions", prompt=PROMPT, max_tokens=1, temperature=0).json()
    text = first["choices"][0]["text"]
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"content": text}).json()["tokens"]
    assert len(tokens) == 1
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)
    banned = client.completions.create(
        model=server.model_id,
        prompt=PROMPT,
        n=2,
        max_tokens=1,
        temperature=0,
        logit_bias={str(tokens[0]): -100},
    )
    assert all(c.text and c.text != text for c in banned.choices)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"grammar": "root ::= nothing"}, "grammar", "Undefined rule identifier 'nothing'"),
        ({"grammar": 'root ::= "a'}, "grammar", "could not be parsed"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "?"}}}},
            "response_format",
            "Invalid type: ?",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "json_object"),
        (
            {"grammar": 'root ::= "a"', "json_schema": {"type": "object"}},
            "json_schema",
            "only one of",
        ),
        ({"logit_bias": {"word": -100}}, "logit_bias", "token ids"),
        ({"logit_bias": {"99999999": -100}}, "logit_bias", "not in the vocabulary"),
        ({"logit_bias": {"5": -500}}, "logit_bias", "[-100, 100]"),
    ],
)
def test_bad_constraints_are_400s_that_say_why(
    server: RunningServer, body: dict, param: str, words: str
) -> None:
    response = post(server, "/completions", prompt="x", max_tokens=2, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_json_answer_closes_within_max_tokens(chat_server: RunningServer) -> None:
    """Issue 37's request: an integer without bounds ran to max_tokens ("age": 4000…)
    under JSON Schema's own reading; bounded as llama.cpp's converter bounds numbers
    (docs/constraints.md), every choice closes."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    out = post(
        chat_server,
        "/chat/completions",
        n=3,
        max_tokens=64,
        seed=37,
        messages=[
            {"role": "user", "content": "Invent a character. Answer in JSON with name and age."}
        ],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert out.status_code == 200, out.text
    for choice in out.json()["choices"]:
        assert choice["finish_reason"] == "stop"
        value = json.loads(choice["message"]["content"])
        assert set(value) == {"name", "age"} and abs(value["age"]) <= 10**16

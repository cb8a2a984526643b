"""Every branch of a constrained request is what its constraint asks for (issue 28): each
kind of constraint field on /v1/completions, /v1/chat/completions and llama.cpp's
/completion, streamed and not, with n > 1, `best_of`, `banned_strings` (rewinds under a
grammar) and `distinct_openings`. Each choice is judged by something other than the
server's masks (tests/integration/judges.py: jsonschema, llama.cpp's own GBNF sampler,
llguidance over bytes). A choice that ended is judged complete; one cut by max_tokens, only
where a constraint cannot bound its length, must be a start the constraint may continue.

The fields are those of llama.cpp's server (`grammar`, `json_schema`; tools/server/
README.md), OpenAI's `response_format` (`json_object`, `json_schema` with `strict`), vLLM's
`guided_regex` / `guided_grammar` and SGLang's `regex`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from llama_srb.bundled_model import bundled_model_path
from llama_srb.native import Model
from tests.integration.judges import gbnf_verdict, lark_verdict, regex_verdict, schema_verdict
from tests.support.server import RunningServer

# Bounded: every output ends within max_tokens, so every choice must end and be complete.
SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"enum": ["calm", "stormy"]},
        "lit": {"type": "boolean"},
        "keeper": {"type": "string", "maxLength": 12},
    },
    "required": ["mood", "lit", "keeper"],
}
# What the server holds SCHEMA to: an object lists all its keys (as llama.cpp reads it).
CLOSED_SCHEMA = {**SCHEMA, "additionalProperties": False}
STRICT_SCHEMA = {
    "type": "object",
    "properties": {
        "weather": {"enum": ["rain", "fog", "clear"]},
        "ships": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["weather", "ships"],
    "additionalProperties": False,
}
GBNF = 'root ::= "The " color " lamp is " state "."\ncolor ::= "red" | "green" | "white"\nstate ::= "on" | "off" | [0-9] "0%"'
LARK = 'start: "Lamp: " STATE "."\nSTATE: "on" | "off" | /[0-9]{1,2}%/'
REGEX = r"(calm|stormy) night, [a-z]{1,8}\."
LIST_GBNF = (  # llama.cpp's grammars/list.gbnf: unbounded
    'root ::= item+\nitem ::= "- " [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ "\\n"'
)
PROMPT = "The lighthouse keeper wrote in his log:"
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def model(bundled_model: str) -> Iterator[Model]:
    """The model in this process too, for llama.cpp's grammar (the GBNF judge)."""
    loaded = Model(bundled_model_path(bundled_model))
    yield loaded
    loaded.close()


Verdict = Callable[[Model, str, bool], str | None]


@dataclass(frozen=True)
class Case:
    fields: dict[str, Any]
    verdict: Verdict
    bounded: bool = True  # every output ends within MAX_TOKENS


def schema_case(field: str, value: object, schema: dict[str, Any]) -> Case:
    return Case({field: value}, lambda _m, text, done: schema_verdict(schema, text, done))


CASES = {
    "json_schema": schema_case("json_schema", SCHEMA, CLOSED_SCHEMA),
    "response_format json_schema strict": schema_case(
        "response_format",
        {
            "type": "json_schema",
            "json_schema": {"name": "w", "strict": True, "schema": STRICT_SCHEMA},
        },
        STRICT_SCHEMA,
    ),
    "response_format json_object": Case(
        {"response_format": {"type": "json_object"}},
        lambda _m, text, done: schema_verdict({"type": "object"}, text, done),
        bounded=False,
    ),
    "grammar GBNF": Case(
        {"grammar": GBNF}, lambda m, text, done: gbnf_verdict(m, GBNF, text, done)
    ),
    "grammar GBNF unbounded (list.gbnf)": Case(
        {"grammar": LIST_GBNF},
        lambda m, text, done: gbnf_verdict(m, LIST_GBNF, text, done),
        bounded=False,
    ),
    "grammar %llguidance Lark": Case(
        {"grammar": "%llguidance {}\n" + LARK},
        lambda _m, text, done: lark_verdict(LARK, text, done),
    ),
    "guided_grammar Lark": Case(
        {"guided_grammar": LARK}, lambda _m, text, done: lark_verdict(LARK, text, done)
    ),
    "guided_grammar GBNF": Case(
        {"guided_grammar": GBNF}, lambda m, text, done: gbnf_verdict(m, GBNF, text, done)
    ),
    "guided_regex": Case(
        {"guided_regex": REGEX}, lambda _m, text, done: regex_verdict(REGEX, text, done)
    ),
    "regex (SGLang)": Case(
        {"regex": REGEX}, lambda _m, text, done: regex_verdict(REGEX, text, done)
    ),
}


@dataclass
class Choice:
    text: str
    finish_reason: str | None


def judge(model: Model, case: Case, choices: list[Choice], n: int) -> None:
    """All n choices are there, each ended (or, unbounded, was cut), each valid."""
    assert len(choices) == n, choices
    for i, choice in enumerate(choices):
        assert choice.finish_reason in (("stop",) if case.bounded else ("stop", "length")), (
            i,
            choice,
        )
        verdict = case.verdict(model, choice.text, choice.finish_reason == "stop")
        assert verdict is None, f"choice {i}: {verdict}"


def post(server: RunningServer, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(f"{server.base_url}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def events(server: RunningServer, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The stream's events; an error event fails the test."""
    url = f"{server.base_url}{path}"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                assert "error" not in event, event
                yield event


def completions(server: RunningServer, body: dict[str, Any], stream: bool) -> list[Choice]:
    if not stream:
        out = post(server, "/v1/completions", body)["choices"]
        return [
            Choice(c["text"], c["finish_reason"]) for c in sorted(out, key=lambda c: c["index"])
        ]
    choices = [Choice("", None) for _ in range(body["n"])]
    for event in events(server, "/v1/completions", body):
        for c in event["choices"]:
            choices[c["index"]].text += c["text"]
            choices[c["index"]].finish_reason = (
                c["finish_reason"] or choices[c["index"]].finish_reason
            )
    return choices


def chat(server: RunningServer, body: dict[str, Any], stream: bool) -> list[Choice]:
    if not stream:
        out = post(server, "/v1/chat/completions", body)["choices"]
        return [Choice(c["message"]["content"], c["finish_reason"]) for c in out]
    choices = [Choice("", None) for _ in range(body["n"])]
    for event in events(server, "/v1/chat/completions", body):
        for c in event["choices"]:
            choices[c["index"]].text += c["delta"].get("content") or ""
            choices[c["index"]].finish_reason = (
                c["finish_reason"] or choices[c["index"]].finish_reason
            )
    return choices


def native(server: RunningServer, body: dict[str, Any], stream: bool) -> list[Choice]:
    """llama.cpp's /completion: `stop_type` "eos" (or "word") for an ended result, "limit"
    for one cut by n_predict."""

    def finish(result: dict[str, Any]) -> str:
        return "length" if result["stop_type"] == "limit" else "stop"

    if not stream:
        out = post(server, "/completion", body)
        results = out if isinstance(out, list) else [out]
        return [Choice(r["content"], finish(r)) for r in sorted(results, key=lambda r: r["index"])]
    choices = [Choice("", None) for _ in range(body["n"])]
    for event in events(server, "/completion", body):
        choices[event["index"]].text += event["content"]
        if event["stop"]:
            choices[event["index"]].finish_reason = finish(event)
    return choices


BASE = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 5}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(CASES))
def test_completions_every_choice_is_valid(
    server: RunningServer, model: Model, name: str, stream: bool
) -> None:
    case = CASES[name]
    body = {**BASE, "n": 4, **case.fields}
    judge(model, case, completions(server, body, stream), 4)


@pytest.mark.parametrize(
    "name", ["json_schema", "grammar GBNF", "guided_grammar Lark", "regex (SGLang)"]
)
def test_best_of_returns_valid_choices(server: RunningServer, model: Model, name: str) -> None:
    """best_of=6 branches are decoded, each with its own matcher; the 2 best come back."""
    case = CASES[name]
    out = post(server, "/v1/completions", {**BASE, "n": 2, "best_of": 6, **case.fields})
    assert out["usage"]["completion_tokens"] > sum(
        len(model.tokenize(c["text"], False, False)) for c in out["choices"]
    )  # the four not returned were decoded too
    judge(model, case, [Choice(c["text"], c["finish_reason"]) for c in out["choices"]], 2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", ["guided_regex", "json_schema", "guided_grammar Lark"])
def test_distinct_openings_under_a_grammar(
    server: RunningServer, model: Model, name: str, stream: bool
) -> None:
    """Each branch's first token is one the grammar allows (no earlier branch's while
    any is left), and each choice is valid."""
    case = CASES[name]
    body = {**BASE, "n": 4, "distinct_openings": True, **case.fields}
    judge(model, case, completions(server, body, stream), 4)


# Rewinds under a grammar: +100 on the tokens of "calm" makes every branch write it where
# the grammar lets it; the ban takes each back to where the phrase began (its first token:
# back to the grammar's start) and it must write "stormy" instead.
CALM = {"logit_bias": [["calm", 100]]}
REWIND_CASES = {
    "regex, the phrase first": Case(
        {"guided_regex": "(calm|stormy) sea", **CALM},
        lambda _m, text, done: regex_verdict("(calm|stormy) sea", text, done),
    ),
    "json_schema": Case(
        {"json_schema": {"enum": ["calm", "stormy"]}, **CALM},
        lambda _m, text, done: schema_verdict({"enum": ["calm", "stormy"]}, text, done),
    ),
    "grammar GBNF": Case(
        {"grammar": 'root ::= "The sea was " ("calm" | "stormy") "."', **CALM},
        lambda m, text, done: gbnf_verdict(
            m, 'root ::= "The sea was " ("calm" | "stormy") "."', text, done
        ),
    ),
    "guided_grammar Lark": Case(
        {"guided_grammar": 'start: "Sea: " SEA "."\nSEA: "calm" | "stormy"', **CALM},
        lambda _m, text, done: lark_verdict(
            'start: "Sea: " SEA "."\nSEA: "calm" | "stormy"', text, done
        ),
    ),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(REWIND_CASES))
def test_banned_strings_rewind_under_a_grammar(
    server: RunningServer, model: Model, name: str, stream: bool
) -> None:
    case = REWIND_CASES[name]
    body = {**BASE, "n": 4, **case.fields}
    unbanned = completions(server, body, stream)
    assert all("calm" in c.text for c in unbanned), unbanned  # what the bans must undo
    banned = completions(server, {**body, "banned_strings": ["calm"]}, stream)
    judge(model, case, banned, 4)
    assert not any("calm" in c.text.lower() for c in banned), banned


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    "name",
    [
        "response_format json_schema strict",
        "response_format json_object",
        "guided_regex",
        "guided_grammar Lark",
    ],
)
def test_chat_every_choice_is_valid(
    chat_server: RunningServer, model: Model, name: str, stream: bool
) -> None:
    case = CASES[name]
    body = {
        "messages": [{"role": "user", "content": "Describe tonight's weather at sea."}],
        "n": 3,
        "max_tokens": MAX_TOKENS,
        "seed": 2,
        **case.fields,
    }
    judge(model, case, chat(chat_server, body, stream), 3)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", ["json_schema", "grammar GBNF", "guided_regex"])
def test_native_completion_every_result_is_valid(
    server: RunningServer, model: Model, name: str, stream: bool
) -> None:
    """llama.cpp's /completion with its own fields (`grammar`, `json_schema`, n_predict)."""
    case = CASES[name]
    body = {"prompt": PROMPT, "n_predict": MAX_TOKENS, "n": 3, "seed": 9, **case.fields}
    judge(model, case, native(server, body, stream), 3)

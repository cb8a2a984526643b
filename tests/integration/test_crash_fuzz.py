"""Crash hunting: hypothesis combines what once killed the process — grammars (GBNF and
Lark, in `grammar` and `guided_grammar`), regular expressions (`guided_regex`, `regex`),
JSON schemas, response formats, ignore_eos, min_tokens, logprobs, echo, n, every sampler
parameter at legal and edge values, prompt lists and token-id prompts — and after each
request the answer must be a 2xx or a 4xx and the server alive and healthy.

Bounded for CI: a fixed number of examples, short outputs, a small context.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.server import RunningServer

EXAMPLES = 80

GRAMMARS = [
    'root ::= "a"',  # complete after one token: with EOS masked this once aborted
    'root ::= [a-z]+ "."',
    'root ::= ("yes" | "no")',
    "root ::= " + "(" * 64 + '"x"' + ")" * 64,
    'root ::= "a"{2,5}',
    "root ::= undefined",  # invalid: a 400
    'root ::= "unterminated',
    "root ::= root",  # left recursion: a 400
    "",
    '%llguidance {}\nstart: "a" | "b"',  # Lark in `grammar`, as llama.cpp takes it
]
# guided_grammar (vLLM): Lark when it has a `start:` rule, else GBNF (GRAMMARS too).
LARKS = [
    'start: "a" | "b"',
    'start: /[a-z]+/ "."',
    'start: x\nx: x "a" | "a"',  # left recursion: fine for an Earley parser
    'start: %json {"type": "object"}',
    "start: foo",  # an unknown rule: a 400
    'start: "unterminated',
    "start: <[999999999]>",  # a token id past the vocabulary: a 400
]
# guided_regex (vLLM) and regex (SGLang), in Rust's regex syntax.
REGEXES = [
    "[a-z]{1,5}",
    "(yes|no)",
    r"\d+\.",
    "",
    "(a|aa)*b",
    "a{1000}",
    "^((a{0,100}){0,100}){0,100}$",
    "a(b",  # invalid: a 400 for each of these
    "[z-a]",
    r"\p{Nope}",
    "(?<=a)b",  # look-behind: Rust's regex has none
]
SCHEMAS: list[Any] = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "string", "maxLength": 3},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
    {"type": "string", "maxLength": 5000},  # beyond the repetition limit: a 400
    {"type": "string", "pattern": "^a{2,4}$"},
    {},
    {"type": "nonsense"},
]


def edge(*values: object) -> st.SearchStrategy[object]:
    return st.sampled_from(values)


# The first ids past each bundled model's vocabulary: Gemma 3's 262,144 and SmolLM2's 49,152.
PAST_VOCAB = (262144, 49152)


SAMPLERS: dict[str, st.SearchStrategy[object]] = {
    "temperature": edge(0, 0.0001, 0.8, 2.0, 100, -1, 1e308),
    "top_k": edge(0, 1, 40, *PAST_VOCAB, 10**9, -1),
    "top_p": edge(0, 0.1, 1, 1.5),
    "min_p": edge(0, 0.5, 1, -0.1),
    "typical_p": edge(0, 0.5, 1),
    "repeat_penalty": edge(0, 1, 1.5, 10, 11),
    "repeat_last_n": edge(-1, 0, 1, 64, 1024, 10**12),
    "frequency_penalty": edge(-2, 0, 2, 3),
    "presence_penalty": edge(-2, 0, 2),
    "dry_multiplier": edge(0, 0.8, 100),
    "dry_base": edge(0.5, 1, 1.75, 100),
    "dry_allowed_length": edge(0, 1, 2, 1000, 2**40),
    "dry_penalty_last_n": edge(-1, 0, 16, 1024, 2**33),
    "dry_sequence_breakers": edge([], ["\n"], ["", "a"], ["x" * 65], ["a"] * 65),
    "xtc_probability": edge(0, 0.5, 1),
    "xtc_threshold": edge(0, 0.1, 0.5, 1),
    "top_n_sigma": edge(-1, 0, 0.5, 5),
    "mirostat": edge(0, 1, 2, 3),
    "mirostat_tau": edge(0, 5, 100),
    "mirostat_eta": edge(0, 0.1, 1),
    "dynatemp_range": edge(0, 0.5, 100),
    "dynatemp_exponent": edge(0, 1, 100),
    "seed": edge(0, -1, 2**32, 2**64 - 1, -(2**63)),
    "min_tokens": edge(0, 1, 3, 100, 2**31),
    "ignore_eos": st.booleans(),
    "stop": edge("\n", ["a", "b"], [""], ["."] * 65),
    "logit_bias": edge(
        {"0": 100}, {"1": -100}, *({str(t): 1} for t in PAST_VOCAB), {"-1": 1}, {"2": 101}
    ),
    # Choosing between branches: rewinds (also under a grammar), ranking, first-token draws
    # and per-branch chains.
    "banned_strings": edge(["a"], [" ", "b"], ["\ud800"], [""], ["x" * 257], ["a"] * 129),
    "banned_strings_case_sensitive": st.booleans(),
    "best_of": edge(1, 4, 5, 0, 10**9),
    "distinct_openings": st.booleans(),
    "choices_params": edge(
        [{"temperature": 0}],
        [{}, {"top_k": 10**9, "xtc_probability": 1}],
        [{"mirostat": 2}, {"dry_multiplier": 100, "dry_allowed_length": 2**40}],
        [{"seed": 1}],
        [{"temperature": 1e308}] * 9,
    ),
}

PROMPTS: st.SearchStrategy[object] = st.one_of(
    st.text(alphabet="ab <>_/\n.é🙂", max_size=30),
    edge("<start_of_turn>model\n", "<bos>", "<eos>", "<|im_start|>assistant\n", "<|im_end|>", ""),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=20),
    edge([-1], [2**31], *([t] for t in PAST_VOCAB), [[1, 2], [3]], ["a", "b"], [[]], []),
)


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, object]:
    body: dict[str, object] = {
        "prompt": draw(PROMPTS),
        "max_tokens": draw(edge(0, 1, 4, 8)),
        "n": draw(edge(1, 2, 4, 0, 5)),
        "stream": draw(st.booleans()),
    }
    constraint = draw(
        edge(
            None,
            "grammar",
            "json_schema",
            "response_format",
            "json_object",
            "guided_grammar",
            "guided_regex",
            "regex",
        )
    )
    if constraint == "grammar":
        body["grammar"] = draw(st.sampled_from(GRAMMARS))
    elif constraint == "json_schema":
        body["json_schema"] = draw(st.sampled_from(SCHEMAS))
    elif constraint == "response_format":
        schema = draw(st.sampled_from(SCHEMAS))
        strict = draw(edge(None, True, False))
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "f", "schema": schema, "strict": strict},
        }
    elif constraint == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif constraint == "guided_grammar":
        body["guided_grammar"] = draw(st.sampled_from(LARKS + GRAMMARS))
    elif constraint in ("guided_regex", "regex"):
        body[constraint] = draw(st.sampled_from(REGEXES))
    if draw(st.booleans()):
        body["logprobs"] = draw(edge(0, 1, 5, 20, 21))
        body["echo"] = draw(st.booleans())
    for name in draw(st.lists(st.sampled_from(sorted(SAMPLERS)), max_size=6, unique=True)):
        body[name] = draw(SAMPLERS[name])
    return body


def answer(server: RunningServer, body: dict[str, object]) -> int:
    url = f"{server.api_url}/completions"
    # json.dumps escapes a lone surrogate (\ud800) as JSON may; httpx's encoder would refuse it
    content, headers = json.dumps(body), {"Content-Type": "application/json"}
    with httpx.stream("POST", url, content=content, headers=headers, timeout=120) as response:
        text = "".join(response.iter_text())
    if response.status_code >= 400:
        assert "error" in json.loads(text), text
    elif body.get("stream"):
        assert text.rstrip().endswith("data: [DONE]"), text[-500:]
    return response.status_code


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(body=completion_bodies())
def test_no_request_crashes_the_server(fuzz_server: RunningServer, body: dict) -> None:
    status = answer(fuzz_server, body)
    assert status < 500, f"{status} for {json.dumps(body)[:2000]}"
    assert fuzz_server.process.poll() is None, fuzz_server.log()[-3000:]
    assert httpx.get(f"{fuzz_server.base_url}/health", timeout=30).status_code == 200

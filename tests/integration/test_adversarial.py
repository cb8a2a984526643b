"""Requests that once killed, stalled or slipped past the server (issue 9), one regression
test each, through the real server and model. A test that sends something which used to
crash the process also checks that the server is still alive and healthy afterwards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llama_srb.sampling.grammar import MAX_GRAMMAR_CHARS, MAX_GRAMMAR_DEPTH
from tests.integration.bundled import ModelFacts
from tests.support.server import RunningServer, run_server

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"
GRAMMAR_A = 'root ::= "a"'

# Every sampler parameter of docs/api.md's table, each at a value that is not its default.
SAMPLER_VALUES: dict[str, object] = {
    "temperature": 1.3,
    "top_k": 5,
    "top_p": 0.5,
    "min_p": 0.2,
    "typical_p": 0.7,
    "min_tokens": 2,
    "ignore_eos": True,
    "seed": 7,
    "repeat_penalty": 1.3,
    "repeat_last_n": 16,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "dry_multiplier": 0.8,
    "dry_base": 2.0,
    "dry_allowed_length": 3,
    "dry_penalty_last_n": 32,
    "dry_sequence_breakers": ["\n", "."],
    "xtc_probability": 0.5,
    "xtc_threshold": 0.2,
    "top_n_sigma": 1.5,
    "mirostat": 2,
    "mirostat_tau": 4.0,
    "mirostat_eta": 0.2,
    "dynatemp_range": 0.5,
    "dynatemp_exponent": 1.5,
    "stop": ["\n\n", "END"],
    "logit_bias": {"1000": -100},
}


# A server of this module's own: it sends hundreds of odd requests, and the shared servers'
# prefix caches should not carry their paths into other modules' tests.
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp(f"adversarial-{bundled_model}")
    with run_server(tmp, "--model", bundled_model, "--n-ctx", "8192") as running:
        yield running


@pytest.fixture(scope="module")
def chat_server(server: RunningServer) -> RunningServer:
    return server


def post(server: RunningServer, path: str, body: object, **kwargs: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120, **kwargs)  # type: ignore[arg-type]


def error_of(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"]["message"])


def assert_healthy(server: RunningServer) -> None:
    assert server.process.poll() is None, server.log()[-3000:]
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


# -- 1. a complete grammar ends the branch, whatever ignore_eos / min_tokens say -----------


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 3}])
def test_a_complete_grammar_ends_the_branch_even_with_eos_masked(
    server: RunningServer, extra: dict
) -> None:
    body = {"prompt": "Say a", "max_tokens": 4, "temperature": 0, "n": 2, "grammar": GRAMMAR_A}
    response = post(server, "/v1/completions", {**body, **extra})
    assert response.status_code == 200, response.text
    for choice in response.json()["choices"]:
        assert (choice["text"], choice["finish_reason"]) == ("a", "stop")
    assert_healthy(server)


def test_chat_json_schema_with_ignore_eos_ends_when_the_json_is_complete(
    chat_server: RunningServer,
) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    body = {
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    }
    response = post(chat_server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert isinstance(json.loads(choice["message"]["content"])["ok"], bool)
    assert_healthy(chat_server)


# -- 2, 3. grammars that overflowed llama.cpp's recursive parser ---------------------------


def test_a_schema_that_expands_into_deep_repetition_is_a_400(server: RunningServer) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, "json_schema": {"type": "string", "maxLength": 100000}}
    message = error_of(post(server, "/v1/completions", body))
    assert "maxLength" in message and "1024" in message
    assert_healthy(server)


def test_a_huge_nested_grammar_is_a_400_naming_the_limit(server: RunningServer) -> None:
    huge = "root ::= " + "(" * 300_000 + '"a"' + ")" * 300_000
    assert str(MAX_GRAMMAR_CHARS) in error_of(
        post(server, "/v1/completions", {"prompt": "Hi", "grammar": huge})
    )
    deep = "root ::= " + "(" * (MAX_GRAMMAR_DEPTH + 1) + '"a"' + ")" * (MAX_GRAMMAR_DEPTH + 1)
    assert str(MAX_GRAMMAR_DEPTH) in error_of(
        post(server, "/v1/completions", {"prompt": "Hi", "grammar": deep})
    )
    assert_healthy(server)


def test_the_deepest_grammar_accepted_parses_and_samples(server: RunningServer) -> None:
    """At the depth limit, on the real parse and engine threads: their stacks suffice."""
    deepest = "root ::= " + "(" * MAX_GRAMMAR_DEPTH + '"a"' + ")" * MAX_GRAMMAR_DEPTH
    body = {"prompt": "Say a", "max_tokens": 3, "n": 2, "grammar": deepest, "temperature": 0}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert [c["text"] for c in response.json()["choices"]] == ["a", "a"]


# -- 4, 5. every sampler parameter works; integers that reach C are bounded ----------------


@pytest.mark.parametrize("name", sorted(SAMPLER_VALUES))
def test_every_sampler_parameter_works_at_a_non_default_value(
    server: RunningServer, chat_server: RunningServer, name: str
) -> None:
    value = SAMPLER_VALUES[name]
    completion = post(
        server, "/v1/completions", {"prompt": STORY, "max_tokens": 6, "n": 2, name: value}
    )
    assert completion.status_code == 200, completion.text
    assert any(c["text"] for c in completion.json()["choices"])
    chat = post(
        chat_server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 6, name: value},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("mirostat", [0, 1, 2])
def test_all_sampler_parameters_at_once(server: RunningServer, mirostat: int) -> None:
    body = {**SAMPLER_VALUES, "mirostat": mirostat, "prompt": STORY, "max_tokens": 8, "n": 3}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert all(c["text"] for c in response.json()["choices"])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("top_k", 300_000),  # beyond the vocabulary
        ("repeat_last_n", 6_442_450_943),  # ctypes would have truncated it
        ("repeat_last_n", 100_000),  # beyond the context
        ("dry_penalty_last_n", 100_000),
        ("dry_allowed_length", 2**40),
        ("min_tokens", 2**31),
        ("mirostat", 3),
        ("max_tokens", 2**63),
        ("logprobs", 2**31),
    ],
)
def test_integers_beyond_what_means_anything_are_a_400(
    server: RunningServer, name: str, value: int
) -> None:
    body = {"prompt": STORY, "max_tokens": 4, "dry_multiplier": 0.5, name: value}
    assert name in error_of(post(server, "/v1/completions", body))


# -- 6. heavy preparation runs off the event loop ------------------------------------------


def test_health_answers_while_a_huge_tokenize_is_in_progress(server: RunningServer) -> None:
    """Ordering, not timing: /health completes while the 7 MB /tokenize still runs."""
    content = "The keeper counted the steps. " * 233_000  # about 7 MB
    done = threading.Event()

    def tokenize() -> None:
        try:
            # Plain text: special tokens are parsed only in texts that can fit the context.
            body = {"content": content, "parse_special": False}
            post(server, "/tokenize", body).raise_for_status()
        finally:
            done.set()

    worker = threading.Thread(target=tokenize)
    worker.start()
    time.sleep(1.0)  # the body is sent and tokenizing has begun (it takes seconds)
    answered_while_busy = 0
    while not done.is_set() and answered_while_busy < 5:
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
        answered_while_busy += not done.is_set()
    worker.join()
    assert answered_while_busy >= 3


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("logit_bias", {str(t): -1 for t in range(5000)}, "4096"),
        ("stop", [f"stop {i}" for i in range(65)], "64"),
        ("stop", ["x" * 513], "512"),
        ("dry_sequence_breakers", ["y"] * 17, "16"),
    ],
)
def test_per_branch_lists_are_capped(
    server: RunningServer, field: str, value: object, limit: str
) -> None:
    body = {"prompt": STORY, "max_tokens": 2, "n": 8, field: value}
    assert limit in error_of(post(server, "/v1/completions", body))


def test_a_text_that_cannot_fit_is_refused_before_the_quadratic_special_token_pass(
    server: RunningServer, chat_server: RunningServer, model_facts: ModelFacts
) -> None:
    specials = model_facts.turn_start * 100_000  # over 1 MB: minutes in llama.cpp's tokenizer
    for target, path, body in [
        (server, "/v1/completions", {"prompt": specials}),
        (server, "/tokenize", {"content": specials}),
        (
            chat_server,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": specials}]},
        ),
    ]:
        response = post(target, path, body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "context_length_exceeded"


# -- 7. prompt lists count against --max-queue, as their prompts -----------------------------


@pytest.fixture(scope="module")
def tight_queue(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str
) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp(f"tight_queue-{bundled_model}")
    args = (
        "--model",
        bundled_model,
        "--max-queue",
        "2",
        "--client-max-queue",
        "2",
        "--n-ctx",
        "2048",
    )
    with run_server(tmp, *args) as running:
        yield running


def test_a_prompt_list_counts_as_its_prompts_against_the_queue(tight_queue: RunningServer) -> None:
    three = {"prompt": ["a", "b", "c"], "max_tokens": 2}
    assert "--max-queue" in error_of(post(tight_queue, "/v1/completions", three))
    two = post(tight_queue, "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2})
    assert two.status_code == 200 and len(two.json()["choices"]) == 2


# -- 8. lone surrogates are not text --------------------------------------------------------

SURROGATE = "\ud800"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": f"Hi {SURROGATE}"}),
        ("/v1/completions", {"prompt": "Hi", "model": SURROGATE}),
        ("/v1/completions", {"prompt": "Hi", "grammar": f'root ::= "{SURROGATE}"'}),
        ("/v1/completions", {"prompt": "Hi", "stop": ["a", SURROGATE]}),
        ("/v1/completions", {"prompt": "Hi", "logit_bias": {SURROGATE: 1}}),
        ("/tokenize", {"content": SURROGATE}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": SURROGATE}]},
        ),
    ],
)
def test_a_lone_surrogate_is_a_400(server: RunningServer, path: str, body: dict) -> None:
    # Sent as the JSON escape, as a client's serializer writes it.
    raw = json.dumps(body).encode()
    response = httpx.post(
        f"{server.base_url}{path}", content=raw, headers={"Content-Type": "application/json"}
    )
    assert "lone UTF-16 surrogate" in error_of(response)


# -- 9. message content is text, never control tokens ---------------------------------------


def chat_prompt_tokens(server: RunningServer, content: str) -> int:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


def test_message_content_cannot_forge_a_turn(
    chat_server: RunningServer, model_facts: ModelFacts
) -> None:
    forged = model_facts.forged_turn()
    as_text = post(chat_server, "/tokenize", {"content": forged, "parse_special": False}).json()
    as_special = post(chat_server, "/tokenize", {"content": forged, "parse_special": True}).json()
    assert len(as_text["tokens"]) > len(as_special["tokens"])  # the markers are spelled out
    added = chat_prompt_tokens(chat_server, forged) - chat_prompt_tokens(chat_server, "")
    assert added == len(as_text["tokens"])


# -- 10. a non-streaming client that hangs up is not a server error -------------------------


def test_a_non_streaming_client_that_leaves_is_not_a_500(server: RunningServer) -> None:
    before = server.log().count("Traceback")
    errors_before = server.metrics().get(
        'llama_srb_http_requests_total{method="POST",route="/v1/completions",status="500"}', 0
    )
    body = json.dumps({"prompt": STORY, "max_tokens": 200, "ignore_eos": True}).encode()
    for _ in range(3):
        client = httpx.Client(timeout=0.5)
        with pytest.raises(httpx.TimeoutException):
            client.post(
                f"{server.api_url}/completions",
                content=body,
                headers={"Content-Type": "application/json"},
            )
        client.close()  # hangs up mid-generation
    deadline = time.monotonic() + 30
    while server.metric("llama_srb_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log().count("Traceback") == before, server.log()[-3000:]
    errors_after = server.metrics().get(
        'llama_srb_http_requests_total{method="POST",route="/v1/completions",status="500"}', 0
    )
    assert errors_after == errors_before


def test_a_client_that_leaves_before_its_body_arrives_is_not_a_500(
    server: RunningServer,
) -> None:
    before = server.log().count("Traceback")
    port = int(server.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            b'{"prompt": "a"'
        )
        time.sleep(0.5)
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    time.sleep(0.5)
    assert server.log().count("Traceback") == before, server.log()[-3000:]
    assert not any('status="500"' in name and value for name, value in server.metrics().items())


# -- 13. with keys set, the key check comes first and covers the docs -----------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp(f"keyed-{bundled_model}")
    args = ("--model", bundled_model, "--api-key", "sesame", "--n-ctx", "1024")
    with run_server(tmp, *args) as running:
        yield running


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_the_api_docs_need_the_key_too(keyed: RunningServer, path: str) -> None:
    assert httpx.get(f"{keyed.base_url}{path}").status_code == 401
    key = {"Authorization": "Bearer sesame"}
    assert httpx.get(f"{keyed.base_url}{path}", headers=key).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/metrics", "/", "/app.js"])
def test_health_metrics_and_the_ui_stay_open(keyed: RunningServer, path: str) -> None:
    assert httpx.get(f"{keyed.base_url}{path}").status_code == 200


def test_a_malformed_body_without_a_key_is_a_401_not_a_400(keyed: RunningServer) -> None:
    response = httpx.post(
        f"{keyed.api_url}/completions",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 401


def test_an_empty_api_key_is_refused_at_startup(tmp_path: Path) -> None:
    """Refused before any model is loaded: it runs once, with no model."""
    done = subprocess.run(
        [sys.executable, "-m", "llama_srb.cli", "serve", "--port", "0"],
        env={"LLAMA_SRB_API_KEY": "", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "api_key is empty" in done.stderr


# -- 14. an invalid grammar: a useful 400, a short log line ---------------------------------


def test_an_invalid_grammar_gets_its_reason_and_is_not_echoed_to_the_log(
    server: RunningServer,
) -> None:
    before = len(server.log())
    grammar = "root ::= item\n" + 'filler ::= "' + "z" * 50_000 + '"\n'
    message = error_of(post(server, "/v1/completions", {"prompt": "Hi", "grammar": grammar}))
    assert "Undefined rule identifier 'item'" in message
    assert len(message) < 500
    time.sleep(0.2)
    assert len(server.log()) - before < 2_000  # not the 50 kB grammar

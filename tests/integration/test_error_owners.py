"""Errors owned by whoever caused them (issue 37), through the real server.

- A request whose own constraint cannot go on (llguidance's limit on the pattern
  `^((a{0,100}){0,100}){0,100}$`, reached after ~30 a's) is a client error on every route
  that streams: the stream's error event carries the type and code of the same request's
  whole answer (a 400 `constraint_failed`), never `server_error`.
- NaN, ±Infinity and 1e400 anywhere in a body (a story node's stats and params, a sampling
  parameter) are a 400 that names the field, never a 500 from SQLite or the sampler.

SmolLM2 only: the answers' shapes are the same for either model.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.integration.bundled import SMOLLM2
from tests.support.server import RunningServer

pytestmark = pytest.mark.models(SMOLLM2)
TIMEOUT = 180
PATTERN = "^((a{0,100}){0,100}){0,100}$"
# Only a's are allowed, and the end; ignore_eos keeps each branch writing a's until the
# limit. `max_tokens` is far past the ~30 a's where llguidance gives up.
REGEX = {"guided_regex": PATTERN, "ignore_eos": True, "max_tokens": 96, "max_length": 96}
RESPONSE_FORMAT = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": {"type": "string", "pattern": PATTERN}},
    },
    # a's, or the model closes the string at once; and never SmolLM2's one-token `""` (an
    # empty string) as the first token, where the a's bias cannot reach (`"` + a's can)
    "logit_bias": [["a", 100], ['""', -100]],
    "ignore_eos": True,
    "max_tokens": 96,
}
MESSAGES = {"messages": [{"role": "user", "content": "Write it."}]}

# route, body, where its error object is (KoboldCpp's shape on /api/), its 4xx type
CASES: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "completions, regex": ("/v1/completions", {"prompt": "Write it:", "n": 2, **REGEX}, "error", "invalid_request_error"),
    "completions, response_format": ("/v1/completions", {"prompt": "Write it:", **RESPONSE_FORMAT}, "error", "invalid_request_error"),
    "chat, regex": ("/v1/chat/completions", {**MESSAGES, **REGEX}, "error", "invalid_request_error"),
    "chat, response_format": ("/v1/chat/completions", {**MESSAGES, **RESPONSE_FORMAT}, "error", "invalid_request_error"),
    "native": ("/completion", {"prompt": "Write it:", **REGEX}, "error", "invalid_request_error"),
    "kobold": ("/api/extra/generate/stream", {"prompt": "Write it:", **REGEX}, "detail", "bad_input"),
}  # fmt: skip


def streamed(server: RunningServer, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event's JSON data (not `[DONE]`), read to the stream's end."""
    events = []
    url = f"{server.base_url}{route}"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line.removeprefix("data: ")))
    return events


@pytest.mark.parametrize("case", list(CASES))
def test_a_streamed_constraint_failure_is_a_client_error(server: RunningServer, case: str) -> None:
    route, body, key, kind = CASES[case]
    events = streamed(server, route, body)
    assert len(events) > 1 and key not in events[0]  # it failed mid-stream, after some a's
    error = events[-1][key]
    assert error["type"] == kind and error["code"] == "constraint_failed", error
    assert "cannot go on" in error.get("message", error.get("msg", ""))

    whole_route = "/api/v1/generate" if key == "detail" else route
    whole = httpx.post(f"{server.base_url}{whole_route}", json=body, timeout=TIMEOUT)
    assert whole.status_code == 400, whole.text
    assert whole.json()[key]["type"] == kind
    assert whole.json()[key]["code"] == "constraint_failed"
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


# -- numbers that are not finite -------------------------------------------------------

NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400"]


HOLE = "<number>"


def post_raw(
    server: RunningServer, path: str, body: dict[str, Any], number: str, method: str = "POST"
) -> httpx.Response:
    """`body` with `number` written where HOLE is, as a client whose JSON writer emits NaN
    (Python's json does)."""
    text = json.dumps(body).replace(json.dumps(HOLE), number)
    headers = {"Content-Type": "application/json"}
    url = f"{server.api_url}{path}"
    return httpx.request(method, url, content=text, headers=headers, timeout=TIMEOUT)


def assert_names(response: httpx.Response, field: str, number: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and f"`{field}`" in error["message"], error
    assert number in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("number", NUMBERS)
@pytest.mark.parametrize("field", ["stats", "params"])
def test_a_story_node_s_number_that_is_not_finite_is_a_400(
    server: RunningServer, field: str, number: str
) -> None:
    node = {"id": 1, "text": "The sea.", field: {"x": 1.5, "y": HOLE}}
    created = post_raw(server, "/stories", {"nodes": [node]}, number)
    assert_names(created, f"nodes[0].{field}.y", number)

    story = httpx.post(f"{server.api_url}/stories", json={}, timeout=TIMEOUT).json()
    patch = {"base_revision": story["revision"], "nodes": [node]}
    patched = post_raw(server, f"/stories/{story['id']}", patch, number, method="PATCH")
    assert_names(patched, f"nodes[0].{field}.y", number)
    kept = httpx.get(f"{server.api_url}/stories/{story['id']}", timeout=TIMEOUT).json()
    assert kept["revision"] == story["revision"]  # nothing was written


@pytest.mark.parametrize("number", NUMBERS)
def test_a_sampling_parameter_that_is_not_finite_is_a_400(
    server: RunningServer, number: str
) -> None:
    body = {"prompt": "The sea", "max_tokens": 2, "temperature": HOLE}
    assert_names(post_raw(server, "/completions", body, number), "temperature", number)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "top_p": HOLE}
    assert_names(post_raw(server, "/chat/completions", chat, number), "top_p", number)

"""Fuzzing: schemathesis generates valid and invalid requests from the server's own
OpenAPI document; none may get a 5xx, every error is an OpenAI error object (KoboldCpp's
on its API's /api/ routes), and the server is still healthy afterwards.

Bounded for CI: a small context and `n` (the server refuses big requests at once),
max_tokens clamped, a fixed number of examples per route, derandomized.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.support.server import RunningServer

MAX_TOKENS = 8  # keeps every generated request to a fraction of a second
KOBOLD_GENERATE = ("/api/v1/generate", "/api/extra/generate/stream")
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 20}  # per POST route


def clamp(body: object, kobold: bool) -> None:
    """Keep generations short: the fuzzer explores shapes, not long outputs."""
    if isinstance(body, dict):
        if kobold and body.get("max_length") is None:  # KoboldCpp's default is 100 tokens
            body["max_length"] = MAX_TOKENS
        for name in ("max_tokens", "max_completion_tokens", "n_predict", "max_length"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                body[name] = MAX_TOKENS
        # Defaults that are "what fits in the context": /completion's, and chat's (every
        # chat request is served now, the bundled model has a template)
        if "prompt" in body and body.get("n_predict") in (None, -1):
            body["n_predict"] = MAX_TOKENS
        unbounded = body.get("max_tokens") is None and body.get("max_completion_tokens") is None
        if "messages" in body and unbounded:
            body["max_completion_tokens"] = MAX_TOKENS


def fuzz(operation: Any, mode: GenerationMode, base_url: str, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,  # nothing written to the repository
        derandomize=True,  # the same cases on every CI run
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a real call
    )
    @given(case=operation.as_strategy(mode))
    def check(case: Any) -> None:
        clamp(case.body, kobold=case.path in KOBOLD_GENERATE)
        # An upper bound for a busy machine; the server's own timeout (120 s) comes first.
        response = case.call(base_url=base_url, timeout=300)
        where = f"{mode.value} {case.method} {case.path}"
        assert response.status_code < 500, f"{where} → {response.status_code}: {response.text}"
        if response.status_code >= 400 and case.path.startswith("/api/"):
            error = response.json()["detail"]  # KoboldCpp's API: its own error shape
            assert error["msg"] and error["type"], f"{where}: {response.text}"
        elif response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"], f"{where}: {response.text}"

    try:
        check()
    except Unsatisfiable:  # negative mode, nothing to make invalid (a GET without parameters)
        assert mode is GenerationMode.NEGATIVE


# schemathesis' own pytest plugin needs the schema at collection time (and lags pytest
# releases); driving its strategies with hypothesis directly needs neither.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.timeout(1800)  # every route's examples: minutes on a busy machine, not a hang
def test_no_request_gets_a_5xx(fuzz_server: RunningServer, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert any(op.path == "/v1/completions" for op in operations)
    for operation in operations:
        examples = EXAMPLES[mode] if operation.method.upper() == "POST" else 10
        fuzz(operation, mode, fuzz_server.base_url, examples)


def test_the_server_survived_the_fuzzing(fuzz_server: RunningServer) -> None:
    assert httpx.get(f"{fuzz_server.base_url}/health").json()["status"] == "ok"
    out = httpx.post(
        f"{fuzz_server.api_url}/completions", json={"prompt": "Once", "max_tokens": 2}, timeout=60
    )
    assert out.status_code == 200, out.text
    assert fuzz_server.metric("llama_srb_requests_running") == 0


def test_penalties_are_accepted(fuzz_server: RunningServer) -> None:
    """Found by the fuzzer: any penalty used to be a 500 (a wrong native call)."""
    body = {"prompt": "Once", "max_tokens": 4, "presence_penalty": 0.5, "repeat_penalty": 1.1}
    out = httpx.post(f"{fuzz_server.api_url}/completions", json=body, timeout=60)
    assert out.status_code == 200, out.text

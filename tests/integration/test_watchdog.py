"""The watchdog through the real server, with a real long step: one llama_decode call of a
whole long prompt (--n-batch as large as the prompt, one thread), judged against a
--stuck-after far below it. What a native call that never returns looks like from
outside, without a test hook in the server: /health answers 503 naming the request, new
generations are refused, /metrics counts it, and it all recovers when the call returns;
SIGTERM ends the process without waiting for the call.

The default model only: the watchdog judges the engine thread, whatever the model.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.test_hardening import wait_for
from tests.support.server import RunningServer, run_server

pytestmark = pytest.mark.models(GEMMA)

# Gemma reads each " harbor" as one token: a prompt of this many tokens, prefilled alone
# in one call of all but its last token (the server has nothing else to decode).
LONG_PROMPT = " ".join(["harbor"] * 3000)
ONE_CALL = ("--n-batch", "4096", "--threads", "1", "--step-budget", "0", "--n-ctx", "8192")


class Completion(threading.Thread):
    """A whole (not streamed) completion on a thread: its response once it ends."""

    def __init__(self, server: RunningServer, body: dict[str, object]) -> None:
        super().__init__(daemon=True)
        self.server, self.body = server, body
        self.response: httpx.Response | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            url = f"{self.server.api_url}/completions"
            self.response = httpx.post(url, json=self.body, timeout=300)
        except Exception as exc:
            self.error = exc


def health(server: RunningServer) -> httpx.Response:
    return httpx.get(f"{server.base_url}/health", timeout=30)


@pytest.fixture
def slow_steps(tmp_path: Path, bundled_model: str) -> Iterator[RunningServer]:
    args = ("--model", bundled_model, *ONE_CALL, "--stuck-after", "0.5")
    with run_server(tmp_path, *args, "--shutdown-grace", "1") as running:
        yield running


def test_a_step_past_the_bound_is_reported_stuck_until_it_returns(
    slow_steps: RunningServer,
) -> None:
    long = Completion(slow_steps, {"prompt": LONG_PROMPT, "max_tokens": 1})
    long.start()
    wait_for(lambda: health(slow_steps).status_code == 503, within=120)
    stuck = health(slow_steps).json()
    assert stuck["status"] == "stuck" and "--stuck-after" in stuck["error"]
    (request_id,) = stuck["requests"]
    assert slow_steps.metric("llama_srb_engine_stuck") == 1
    assert slow_steps.metric("llama_srb_engine_step_age_seconds") > 0.5
    refused = httpx.post(
        f"{slow_steps.api_url}/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=30
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_stuck"
    wait_for(lambda: f"requests {request_id}" in slow_steps.log(), within=10)

    long.join(300)
    assert long.response is not None and long.response.status_code == 200
    assert long.response.json()["id"] == request_id
    wait_for(lambda: health(slow_steps).status_code == 200, within=30)
    assert slow_steps.metric("llama_srb_engine_stuck") == 0
    assert slow_steps.metric("llama_srb_engine_stuck_steps_total") == 1
    assert slow_steps.metric("llama_srb_engine_longest_step_seconds") > 0.5
    wait_for(lambda: "returned after" in slow_steps.log(), within=10)


def test_sigterm_ends_the_process_while_the_engine_is_inside_a_call(
    tmp_path: Path, bundled_model: str
) -> None:
    """The same long call, made longer (a bigger batch), and SIGTERM during it: the grace
    period passes, the request is ended with an error, and the process exits (status 1,
    as it could not stop its engine thread) without waiting for the call to return."""
    args = ("--model", bundled_model, *ONE_CALL, "--stuck-after", "0.5", "--shutdown-grace", "1")
    with run_server(tmp_path, *args) as server:
        long = Completion(server, {"prompt": LONG_PROMPT, "max_tokens": 1})
        long.start()
        wait_for(lambda: health(server).status_code == 503, within=120)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 1
        long.join(30)
    assert long.response is not None and long.response.status_code == 503
    assert long.response.json()["error"]["code"] == "server_shutting_down"
    log = server.log()
    assert "the engine thread is stuck in a step" in log and "returned after" not in log
    ended = [json.loads(line.split(": ", 1)[1]) for line in log.splitlines() if '"event"' in line]
    assert [line["outcome"] for line in ended] == ["shutdown"]

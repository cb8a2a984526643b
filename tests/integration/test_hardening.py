"""Production hardening through the real server: cancellation, backpressure, auth, body
limit, request timeout and graceful shutdown. Dedicated servers where a flag is needed."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import RunningServer, run_server

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"
LONG = {"prompt": STORY, "max_tokens": 1500, "ignore_eos": True}  # runs for many seconds
IDLE_GAUGES = (
    "llama_srb_requests_running",
    "llama_srb_requests_waiting",
    "llama_srb_sequences_running",
)


# -- helpers -------------------------------------------------------------------------------


def wait_until_idle(server: RunningServer, within: float) -> None:
    """Until /metrics shows nothing running or waiting; fails after `within` seconds (far
    less than LONG takes to finish by itself, so being idle proves it was aborted)."""
    start = time.monotonic()
    while True:
        sample = server.metrics()
        gauges = {name: sample[name] for name in IDLE_GAUGES}
        if not any(gauges.values()):
            return
        if time.monotonic() - start > within:
            pytest.fail(f"still busy {within} s later: {gauges}")
        time.sleep(0.02)


def raw_post(server: RunningServer, body: dict) -> socket.socket:
    """POST /v1/completions on a bare socket, so the test decides when it closes."""
    port = int(server.base_url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    payload = json.dumps(body).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before {marker!r}: {received!r}"
        received += chunk
    return received


def wait_for(condition: object, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class Stream(threading.Thread):
    """A streaming completion read on a thread: its status, its events, and a way to
    hang up early."""

    def __init__(self, server: RunningServer, body: dict, headers: dict | None = None) -> None:
        super().__init__(daemon=True)
        self.url = f"{server.api_url}/completions"
        self.body = {**body, "stream": True}
        self.headers = headers
        self.status: int | None = None
        self.events: list[dict | str] = []
        self.first_text = threading.Event()
        self.hang_up = threading.Event()
        self.ended_at: float | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", self.url, json=self.body, headers=self.headers, timeout=120
            ) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if self.hang_up.is_set():
                        break
                    if line.startswith("data: "):
                        data = line.removeprefix("data: ")
                        event = data if data == "[DONE]" else json.loads(data)
                        self.events.append(event)
                        if isinstance(event, dict) and any(
                            c.get("text") for c in event.get("choices", [])
                        ):
                            self.first_text.set()
        except Exception as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.first_text.set()

    def started(self) -> Stream:
        self.start()
        assert self.first_text.wait(60), "no text streamed in time"
        assert self.error is None, self.error
        return self

    def chunks(self) -> int:
        """How many events with a choice have come."""
        return sum(1 for e in self.events if isinstance(e, dict) and e.get("choices"))

    def finish_reasons(self) -> set[str]:
        return {
            c["finish_reason"]
            for e in self.events
            if isinstance(e, dict)
            for c in e.get("choices", [])
            if c.get("finish_reason")
        }


# -- cancellation ----------------------------------------------------------------------------


def test_a_socket_closed_mid_stream_frees_its_sequences(server: RunningServer) -> None:
    sock = raw_post(server, {**LONG, "n": 4, "stream": True})
    try:
        read_until(sock, b'"text":')
        assert server.metric("llama_srb_sequences_running") == 4
    finally:
        sock.close()
    wait_until_idle(server, within=120)


def test_a_socket_closed_while_waiting_for_a_whole_completion_frees_it(
    server: RunningServer,
) -> None:
    sock = raw_post(server, {**LONG, "n": 3})
    try:
        wait_for(lambda: server.metric("llama_srb_sequences_running") == 3)
    finally:
        sock.close()
    wait_until_idle(server, within=120)


# -- backpressure --------------------------------------------------------------------------


def test_a_full_queue_answers_429_with_retry_after_and_loses_nothing(
    tmp_path: Path, bundled_model: str
) -> None:
    with run_server(
        tmp_path,
        *("--model", bundled_model, "--max-sequences", "1", "--max-n", "1", "--max-queue", "1"),
        *("--n-ctx", "2048"),
    ) as server:
        running = Stream(server, LONG).started()
        queued = Stream(server, {"prompt": STORY, "max_tokens": 4})
        queued.start()
        wait_for(lambda: queued.status is not None)
        assert queued.status == 200
        # /metrics shows the engine's last step: the one after the request was queued.
        wait_for(lambda: server.metric("llama_srb_requests_waiting") == 1)

        body = {"prompt": STORY, "max_tokens": 4}
        refused = [
            httpx.post(f"{server.api_url}/completions", json=b, timeout=30)
            for b in (body, body, {**body, "stream": True})
        ]
        for response in refused:
            assert response.status_code == 429, response.text
            assert int(response.headers["retry-after"]) >= 1
            error = response.json()["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"

        running.hang_up.set()  # the queued request gets its turn and completes
        queued.join(60)
        assert queued.events[-1] == "[DONE]" and queued.finish_reasons() <= {"stop", "length"}
        assert queued.finish_reasons()
        wait_until_idle(server, within=120)
        counted = (
            'llama_srb_http_requests_total{method="POST",route="/v1/completions",status="429"}'
        )
        assert server.metric(counted) == 3


# -- auth, body limit, request timeout (one server with all three) --------------------------


# Long enough for a short request on a busy machine; far shorter than a long one anywhere.
REQUEST_TIMEOUT = 20


@pytest.fixture(scope="module")
def guarded(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str
) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp(f"guarded-{bundled_model}")
    key_file = tmp / "keys.txt"
    key_file.write_text("# one key per line\nsecond-key\n")
    with run_server(
        tmp,
        "--model",
        bundled_model,
        "--api-key",
        "sesame",
        "--api-key-file",
        str(key_file),
        "--request-timeout",
        str(REQUEST_TIMEOUT),
        "--max-body-bytes",
        "65536",
        "--n-ctx",
        "8192",
    ) as running:
        yield running


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("wrong"),
        {"Authorization": "Bearer"},
        {"Authorization": "sesame"},
        bearer("sesamE"),
    ],
)
def test_missing_or_wrong_key_is_a_401_error_object(
    guarded: RunningServer, headers: dict[str, str]
) -> None:
    for response in (
        httpx.get(f"{guarded.api_url}/models", headers=headers),
        httpx.post(
            f"{guarded.api_url}/completions",
            json={"prompt": "x", "max_tokens": 1},
            headers=headers,
        ),
    ):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


@pytest.mark.parametrize("key", ["sesame", "second-key"])
def test_a_right_key_is_let_in_and_health_stays_open(guarded: RunningServer, key: str) -> None:
    assert httpx.get(f"{guarded.api_url}/models", headers=bearer(key)).status_code == 200
    out = httpx.post(
        f"{guarded.api_url}/completions",
        json={"prompt": STORY, "max_tokens": 2},
        headers=bearer(key),
        timeout=120,
    )
    assert out.status_code == 200, out.text
    assert httpx.get(f"{guarded.base_url}/health").status_code == 200


def test_an_oversize_body_is_a_413_error_object(guarded: RunningServer) -> None:
    big = {"prompt": "word " * 20_000, "max_tokens": 1}  # ~100 kB, limit 64 kB
    declared = httpx.post(f"{guarded.api_url}/completions", json=big, headers=bearer("sesame"))

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        data = json.dumps(big).encode()
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    streamed = httpx.post(
        f"{guarded.api_url}/completions",
        content=chunked(),
        headers={**bearer("sesame"), "Content-Type": "application/json"},
    )
    for response in (declared, streamed):
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] == "request_too_large"
        assert "65536" in response.json()["error"]["message"]


def test_a_request_past_the_timeout_gets_an_explicit_error(guarded: RunningServer) -> None:
    longer = {**LONG, "max_tokens": 8000}  # a minute or more even on an idle machine
    stream = Stream(guarded, longer, headers=bearer("sesame")).started()
    started = time.monotonic()
    response = httpx.post(
        f"{guarded.api_url}/completions", json=longer, headers=bearer("sesame"), timeout=600
    )
    assert time.monotonic() - started >= REQUEST_TIMEOUT
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"

    stream.join(600)
    assert stream.events[-1] == "[DONE]"
    error = stream.events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "request_timeout"
    wait_until_idle(guarded, within=120)


# -- graceful shutdown -----------------------------------------------------------------------


def test_sigterm_lets_running_streams_finish_ends_the_rest_and_exits_0(
    tmp_path: Path, bundled_model: str
) -> None:
    """The short stream is six steps from its end when the signal comes, and the grace
    (30 s) holds them even when the machine is busy (2-3 s a step was seen under load);
    the long one needs far longer than the grace even on an idle machine."""
    grace = 30
    args = ("--model", bundled_model, "--shutdown-grace", str(grace), "--n-ctx", "8192")
    with run_server(tmp_path, *args) as server:
        short = Stream(server, {"prompt": STORY, "max_tokens": 12, "ignore_eos": True})
        long = Stream(server, {**LONG, "max_tokens": 8000})
        short.started()
        long.started()
        wait_for(lambda: short.chunks() >= 6, within=300)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)

        # Still listening while the streams drain: the probe sees the drain, and new
        # generations are refused with a reason.
        def draining() -> bool:
            return httpx.get(f"{server.base_url}/health", timeout=5).status_code == 503

        wait_for(draining, within=grace)
        assert httpx.get(f"{server.base_url}/health", timeout=5).json()["status"] == "draining"
        refused = httpx.post(
            f"{server.api_url}/completions", json={"prompt": STORY, "max_tokens": 1}, timeout=5
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_shutting_down"
        short.join(grace + 30)
        long.join(grace + 30)
        assert server.process.wait(timeout=grace + 30) == 0

    assert short.events[-1] == "[DONE]" and short.finish_reasons() == {"length"}
    assert long.events[-1] == "[DONE]"
    error = long.events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "server_shutting_down"
    assert long.ended_at is not None and long.ended_at - signalled >= grace - 0.5
    assert '"outcome": "shutdown"' in server.log()

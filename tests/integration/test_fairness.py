"""Fair share between clients through the real server: named API keys in the log and the
metrics, each client's own share of the queue, a light client served beside heavy ones,
X-Forwarded-For believed only from a configured proxy, and the sessions of one address
dividing its share (issue 38). Addresses other than this machine's come through
X-Forwarded-For from a proxy the server trusts (loopback).

The default model only: what is tested is who is admitted when, and what is logged,
none of which depends on the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.test_hardening import STORY, Stream, wait_for, wait_until_idle
from tests.support.server import RunningServer, run_server

pytestmark = pytest.mark.models(GEMMA)

HEAVY = {"prompt": STORY, "max_tokens": 1500, "ignore_eos": True}  # a minute: cut by the test


def request_lines(server: RunningServer) -> list[dict[str, object]]:
    lines = [line.split(": ", 1)[1] for line in server.log().splitlines() if '"event"' in line]
    return [json.loads(line) for line in lines if '"event": "request"' in line]


def complete(
    server: RunningServer, body: dict[str, object], headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(f"{server.api_url}/completions", json=body, headers=headers, timeout=120)


# -- several keys, each with a name -----------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("named-keys")
    key_file = tmp / "keys"
    key_file.write_text("# the writing group\nalice: key-of-alice\nbob:  key-of-bob\nold-key\n")
    args = ("--model", bundled_model, "--n-ctx", "2048", "--api-key-file", str(key_file))
    with run_server(tmp, *args, "--api-key", "carol: key-of-carol") as running:
        yield running


def test_each_key_is_accepted_and_named_in_the_log_and_the_metrics(keyed: RunningServer) -> None:
    body = {"prompt": STORY, "max_tokens": 3}
    for key in ("key-of-alice", "key-of-bob", "key-of-carol", "old-key"):
        response = complete(keyed, body, {"Authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
    for key in ("alice", "key-of-alic", "Bearer key-of-alice"):
        assert complete(keyed, body, {"Authorization": f"Bearer {key}"}).status_code == 401

    by_key = {line["key"]: line["client"] for line in request_lines(keyed)}
    # The flag's key comes first, then the file's; a key without a name is key-<position>.
    assert by_key == {
        "alice": "key:alice",
        "bob": "key:bob",
        "carol": "key:carol",
        "key-4": "key:key-4",
    }
    metrics = keyed.metrics()
    for name in ("alice", "bob", "carol", "key-4"):
        assert metrics[f'llama_srb_key_requests_total{{key="{name}",outcome="completed"}}'] == 1
        assert metrics[f'llama_srb_key_generated_tokens_total{{key="{name}"}}'] == 3
    assert not any("key-of-" in line for line in keyed.log().splitlines())  # never the key


# -- one client's share of the queue ----------------------------------------------------------


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    """One sequence and no reserve, so that every other request waits; a queue of 4, of
    which one client may fill 2; X-Forwarded-For believed from 127.0.0.1 only."""
    args = ("--model", bundled_model, "--n-ctx", "4096", "--max-sequences", "1", "--max-n", "1")
    limits = ("--reserve-sequences", "0", "--max-queue", "4", "--client-max-queue", "2")
    limits += ("--trusted-proxies", "127.0.0.1")
    with run_server(tmp_path_factory.mktemp("narrow"), *args, *limits) as running:
        yield running


def test_a_prompt_list_counts_against_its_own_clients_share_of_the_queue(
    narrow: RunningServer,
) -> None:
    heavy = {"X-Session-Id": "heavy", "X-Forwarded-For": "198.51.100.1"}
    too_many = complete(narrow, {"prompt": ["a", "b", "c"], "max_tokens": 1}, heavy)
    assert too_many.status_code == 400 and "--client-max-queue" in too_many.text

    running = Stream(narrow, HEAVY, heavy).started()
    try:
        waiting = Stream(narrow, {"prompt": ["a", "b"], "max_tokens": 2}, heavy)
        waiting.start()  # fills the heavy client's share: two prompts wait
        wait_for(lambda: narrow.metric("llama_srb_requests_waiting") == 2)
        full = complete(narrow, {"prompt": "a", "max_tokens": 1}, heavy)
        assert full.status_code == 429 and "of your requests" in full.text
        assert int(full.headers["retry-after"]) >= 1
        # A new session id from the same address shares its share: no more room.
        again = complete(narrow, {"prompt": "a", "max_tokens": 1}, {**heavy, "X-Session-Id": "2"})
        assert again.status_code == 429

        light = {"X-Session-Id": "light", "X-Forwarded-For": "198.51.100.2"}
        other = Stream(narrow, {"prompt": "a", "max_tokens": 2}, light)
        other.start()  # another address still has room
        wait_for(lambda: other.status is not None)
        assert other.status == 200
        wait_for(lambda: narrow.metric("llama_srb_requests_waiting") == 3)
    finally:
        running.hang_up.set()
    for stream in (waiting, other):
        stream.join(60)
        assert stream.events[-1] == "[DONE]"
    wait_until_idle(narrow, within=30)


# -- a light client beside heavy ones ---------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, bundled_model: str) -> Iterator[RunningServer]:
    """Eight sequences for large requests, two more for small ones; X-Forwarded-For is
    believed from loopback (a proxy there)."""
    args = ("--model", bundled_model, "--n-ctx", "16384", "--max-sequences", "8", "--max-n", "4")
    share = ("--reserve-sequences", "2", "--trusted-proxies", "127.0.0.1")
    with run_server(tmp_path_factory.mktemp("shared"), *args, *share) as running:
        yield running


def test_a_light_client_is_served_while_two_heavy_ones_hold_every_large_sequence(
    shared: RunningServer,
) -> None:
    """Strict arrival order kept the light request waiting for a heavy one to end (minutes
    here); now it finishes while both heavy streams still run."""
    heavy = [
        Stream(shared, {**HEAVY, "n": 4}, {"X-Forwarded-For": f"198.51.100.{i}"}).started()
        for i in range(2)
    ]
    try:
        assert shared.metric("llama_srb_sequences_running") == 8
        # heavy-0 holds its address's share (4 sequences): this one waits, whatever its
        # session id says.
        third_from = {"X-Forwarded-For": "198.51.100.0", "X-Session-Id": "another"}
        third = Stream(shared, {**HEAVY, "n": 4}, third_from)
        third.start()
        wait_for(lambda: shared.metric("llama_srb_requests_waiting") == 1)
        light_from = {"X-Forwarded-For": "203.0.113.9", "X-Session-Id": "light"}
        light = complete(shared, {"prompt": STORY, "max_tokens": 8}, light_from)
        assert light.status_code == 200, light.text
        assert all(stream.ended_at is None for stream in heavy)  # still streaming
        assert third.ended_at is None and shared.metric("llama_srb_requests_waiting") == 1
    finally:
        for stream in (*heavy, third):
            stream.hang_up.set()
    wait_until_idle(shared, within=30)
    light_client = "address:203.0.113.9/session:light"
    light_line = next(line for line in request_lines(shared) if line["client"] == light_client)
    assert light_line["outcome"] == "completed"


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(shared: RunningServer) -> None:
    forwarded = {"X-Forwarded-For": "203.0.113.7", "X-Session-Id": "s1"}
    assert complete(shared, {"prompt": "a", "max_tokens": 1}, forwarded).status_code == 200
    assert request_lines(shared)[-1]["client"] == "address:203.0.113.7/session:s1"
    # From 127.0.0.2, which is no proxy of its: ignored, the connection's address counts.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=120) as untrusted:
        body = {"prompt": "a", "max_tokens": 1}
        answer = untrusted.post(f"{shared.api_url}/completions", json=body, headers=forwarded)
    assert answer.status_code == 200
    assert request_lines(shared)[-1]["client"] == "address:127.0.0.2/session:s1"


def test_a_session_id_is_cut_to_a_bounded_length(narrow: RunningServer) -> None:
    response = complete(narrow, {"prompt": "a", "max_tokens": 1}, {"X-Session-Id": "s" * 500})
    assert response.status_code == 200
    assert request_lines(narrow)[-1]["client"] == "address:127.0.0.1/session:" + "s" * 64


def test_the_ui_is_served_with_security_headers(narrow: RunningServer) -> None:
    page = httpx.get(narrow.base_url + "/", timeout=10)
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"

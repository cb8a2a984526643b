"""Live branching on the real server, both bundled models: fork, drop (and refill) and steer
the choices of a call while it streams, with httpx, as a workbench or a script would.

What is compared across computation paths is never sampled text: a fork's first tokens
are greedy and compared with a new request's by tests/support/paths.py's rule (the same
tokens up to a near tie, logprobs within the drift the README states)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.paths import assert_same_greedy, chat_steps, completion_steps
from tests.support.server import RunningServer

TIMEOUT = 600  # an upper bound: the machine may be busy (both cores taken)
STORY = (
    "The lighthouse keeper of Varrow Point kept a ledger of every ship that passed. "
    "On the night of the great storm she wrote the names of seven, and then an eighth "
    "that had no name at all, only a lantern burning green above its prow. "
) * 6


def story(title: str) -> str:
    """A story of its own per test: the prefix cache holds no other request's cells of it."""
    return f"# {title}\n\n{STORY}"


@dataclass
class Stream:
    """A streamed call read on a thread: its id, each choice's text and finish reason."""

    server: RunningServer
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    id: str | None = None
    texts: dict[int, str] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> Stream:
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        try:
            body = {**self.body, "stream": True, "stream_options": {"include_usage": True}}
            url = self.server.base_url + self.path
            with httpx.stream("POST", url, json=body, headers=self.headers, timeout=TIMEOUT) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    self.id = chunk["id"]
                    self.usage = chunk.get("usage") or self.usage
                    for choice in chunk["choices"]:
                        text = choice.get("text")
                        if text is None:
                            text = (choice.get("delta") or {}).get("content") or ""
                        index = choice["index"]
                        self.texts[index] = self.texts.get(index, "") + text
                        if choice["finish_reason"]:
                            self.reasons[index] = choice["finish_reason"]
        except BaseException as exc:  # seen by the test
            self.error = exc
        finally:
            self.done.set()

    def wait_for(self, ready: Callable[[Stream], bool]) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not ready(self):
            assert not self.done.is_set() or ready(self), f"ended first: {self.reasons}"
            assert time.monotonic() < deadline, "the stream never got there"
            time.sleep(0.02)

    def end(self) -> None:
        assert self.done.wait(TIMEOUT)
        assert self.error is None, self.error


def act(
    server: RunningServer, method: str, path: str, body: dict[str, Any] | None = None, **kw: Any
) -> httpx.Response:
    return httpx.request(method, server.base_url + path, json=body, timeout=TIMEOUT, **kw)


def test_a_fork_of_a_streaming_choice_reads_one_token_and_agrees_with_a_new_request(
    server: RunningServer,
) -> None:
    prompt = story("The eighth ship")
    parent = Stream(
        server, "/v1/completions", {"prompt": prompt, "n": 3, "max_tokens": 72, "seed": 5}
    ).start()
    parent.wait_for(lambda s: s.id is not None and len(s.texts.get(1, "")) >= 40)
    assert parent.id is not None
    read = parent.texts[1]  # what the writer has read: whole tokens, so a token boundary
    greedy = {"n": 1, "max_tokens": 6, "temperature": 0, "logprobs": 2, "stream": False}
    fork_path = f"/v1/completions/{parent.id}/choices/1/fork"
    fork = act(server, "POST", fork_path, {**greedy, "at": len(read)})
    assert fork.status_code == 200, fork.text
    answer = fork.json()
    usage = answer["usage"]
    # Nothing already in the cache is read again: only the fork point's token, for its row.
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    fresh = act(server, "POST", "/v1/completions", {**greedy, "prompt": prompt + read}).json()
    steps = completion_steps(answer["choices"][0])
    if fresh["usage"]["prompt_tokens"] == usage["prompt_tokens"]:  # the same tokens, retokenized
        assert_same_greedy(steps, completion_steps(fresh["choices"][0]), 0)
    parent.end()
    assert set(parent.reasons.values()) <= {"length", "stop"}  # it went on to its end
    # The same fork once the parent ended (its cells from the cache): the same tokens
    late = act(server, "POST", fork_path, {**greedy, "at": len(read)}).json()
    assert late["usage"]["prompt_tokens"] == usage["prompt_tokens"]
    assert_same_greedy(steps, completion_steps(late["choices"][0]), 0)


def test_drop_refill_and_steer_change_one_choice_while_the_others_stream_on(
    server: RunningServer,
) -> None:
    base = "/v1/completions"
    parent = Stream(
        server,
        base,
        {
            "prompt": story("The lantern"),
            "n": 4,
            "max_tokens": 96,
            "temperature": 1.0,
            "seed": 3,
            "ignore_eos": True,  # choices 2 and 3 still stream when they are dropped
        },
    ).start()
    parent.wait_for(lambda s: s.id is not None and len(s.texts.get(0, "")) >= 30)
    choice = f"{base}/{parent.id}/choices"
    dropped = act(server, "DELETE", f"{choice}/2")
    assert dropped.json() == {
        "id": parent.id,
        "index": 2,
        "finish_reason": "dropped",
        "refill": None,
    }
    refilled = act(server, "DELETE", f"{choice}/3", {"refill": True})
    assert refilled.status_code == 200 and refilled.json()["refill"] == 4
    # the refill is a choice to act on at once, before its first token has streamed
    early = act(server, "PATCH", f"{choice}/4", {"min_p": 0.05})
    assert early.status_code == 200 and early.json()["steered"] == ["min_p"], early.text
    steered = act(server, "PATCH", f"{choice}/0", {"temperature": 0.5, "append": " Green fire"})
    assert steered.status_code == 200, steered.text
    assert steered.json()["steered"] == ["temperature"] and steered.json()["appended_tokens"] >= 2
    parent.end()
    assert parent.reasons[2] == parent.reasons[3] == "dropped"
    assert parent.reasons[0] in ("length", "stop") and parent.reasons[4] in ("length", "stop")
    assert " Green fire" in parent.texts[0]  # the writer's words, on the stream, in step
    assert parent.texts[4]  # the refill streamed under its own index
    again = act(server, "DELETE", f"{choice}/1")
    assert again.status_code == 409 and "fork" in again.json()["error"]["message"]
    assert parent.usage is not None and parent.usage["completion_tokens"] > 0


def test_chat_choices_fork_and_drop_under_the_chat_route(server: RunningServer) -> None:
    messages = [{"role": "user", "content": story("Tell me about the green lantern")}]
    # ignore_eos: choice 1 must still stream when it is dropped (an instruct model may end
    # its answer first).
    body = {"messages": messages, "n": 2, "max_tokens": 128, "ignore_eos": True}
    parent = Stream(server, "/v1/chat/completions", body).start()
    parent.wait_for(lambda s: s.id is not None and len(s.texts.get(0, "")) >= 20)
    base = f"/v1/chat/completions/{parent.id}/choices"
    fork = act(
        server,
        "POST",
        f"{base}/0/fork",
        {
            "n": 2,
            "max_tokens": 4,
            "stream": False,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
        },
    )
    assert fork.status_code == 200, fork.text
    answer = fork.json()
    assert answer["object"] == "chat.completion" and len(answer["choices"]) == 2
    usage = answer["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert chat_steps(answer["choices"][0])  # a chat answer, with its logprobs
    assert act(server, "DELETE", f"{base}/1").status_code == 200
    parent.end()
    assert parent.reasons[1] == "dropped"


def test_only_the_caller_may_act_and_bad_bodies_name_the_field(server: RunningServer) -> None:
    parent = Stream(
        server,
        "/v1/completions",
        {"prompt": story("Owners"), "n": 2, "max_tokens": 64, "ignore_eos": True},
        headers={"X-Session-Id": "writer-a"},
    ).start()
    parent.wait_for(lambda s: s.id is not None and len(s.texts.get(0, "")) >= 10)
    mine = {"X-Session-Id": "writer-a"}
    theirs = {"X-Session-Id": "writer-b"}
    base = f"/v1/completions/{parent.id}/choices"
    for method, path, body in (
        ("POST", f"{base}/0/fork", {"max_tokens": 2}),
        ("DELETE", f"{base}/0", None),
        ("PATCH", f"{base}/0", {"temperature": 0.1}),
    ):
        other = act(server, method, path, body, headers=theirs)
        assert other.status_code == 404, other.text  # another writer's call does not exist
    assert act(server, "DELETE", f"{base}/9", headers=mine).status_code == 404
    unknown = act(server, "DELETE", "/v1/completions/cmpl-nope/choices/0", headers=mine)
    assert unknown.status_code == 404
    bad = {
        "at": ({"at": -1}, "at"),
        "prompt": ({"prompt": "another"}, "prompt"),
        "max_tokens": ({"max_tokens": "many"}, "max_tokens"),
    }
    for name, (body, param) in bad.items():
        answer = act(server, "POST", f"{base}/0/fork", body, headers=mine)
        assert answer.status_code == 400, name
        assert answer.json()["error"]["param"] == param, answer.text
    far = act(server, "POST", f"{base}/0/fork", {"at": 10**6}, headers=mine)
    assert far.status_code == 400 and far.json()["error"]["param"] == "at"
    # Shared cells fill the context all the same: a fork is refused in its own words.
    wide = act(server, "POST", f"{base}/0/fork", {"n": 2, "max_tokens": 5000}, headers=mine)
    assert wide.status_code == 400, wide.text
    error = wide.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "context_length_exceeded")
    assert error["message"].startswith("this fork needs ") and "2 branches" in error["message"]
    for body, param in (
        ({"grammar": 'root ::= "a"'}, "grammar"),
        ({"temperature": -3}, "temperature"),
        ({}, None),
        ({"append": "x" * 5000}, "append"),
        # typed and bounded as a request's own fields: none reaches the engine
        ({"top_k": 1.5}, "top_k"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": None}, "temperature"),
        ({"dry_sequence_breakers": "abc", "dry_multiplier": 0.5}, "dry_sequence_breakers"),
        ({"repeat_last_n": 2**31 - 1, "repeat_penalty": 1.1}, "repeat_last_n"),  # > n_ctx
        ({"dry_penalty_last_n": 2**31 - 1, "dry_multiplier": 0.8}, "dry_penalty_last_n"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
    ):
        answer = act(server, "PATCH", f"{base}/0", body, headers=mine)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["param"] == param, answer.text
    refill = act(server, "DELETE", f"{base}/0", {"refill": "yes please"}, headers=mine)
    assert refill.status_code == 400 and refill.json()["error"]["param"] == "refill"
    parent.end()
    # Ended: drop and steer are past; a fork reads the choice from the cache.
    assert act(server, "PATCH", f"{base}/0", {"temperature": 1}, headers=mine).status_code == 409
    late = act(server, "POST", f"{base}/0/fork", {"max_tokens": 2, "stream": False}, headers=mine)
    assert late.status_code == 200, late.text
    usage = late.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_fork_answers_like_any_completion(server: RunningServer, stream: bool) -> None:
    parent = act(
        server, "POST", "/v1/completions", {"prompt": story("Forks"), "n": 2, "max_tokens": 24}
    ).json()
    answer = act(
        server,
        "POST",
        f"/v1/completions/{parent['id']}/choices/1/fork",
        {"n": 3, "max_tokens": 5, "stream": stream, "at": 10},
    )
    assert answer.status_code == 200, answer.text
    if stream:
        chunks = [
            json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")
        ]
        assert {c["index"] for chunk in chunks for c in chunk["choices"]} == {0, 1, 2}
        assert answer.text.rstrip().endswith("data: [DONE]")
    else:
        body = answer.json()
        assert body["object"] == "text_completion" and len(body["choices"]) == 3
        assert body["id"] != parent["id"]

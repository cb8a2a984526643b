"""The inputs that held llama.cpp's grammar sampler for seconds to minutes (issue 28; the
README's old Known limits) end, through the server, with an answer that matches them or an
error that says why, while a concurrent stream completes. Each is sent with n at the
server's largest (64) and a +100 bias on the letter that leads into its worst path, so that
every branch goes as deep as the grammar lets it.

No timing is asserted: the bounds are llguidance's limits per step (sampling/
constraint.py), and bench/bench_constrained.py measures what they cost the other stream.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx
import pytest

from tests.integration.bundled import SMOLLM2
from tests.support.pathological import PATHOLOGICAL, N
from tests.support.server import RunningServer


class Stream:
    """One streamed /v1/completions request on a thread: its choices' texts and finish
    reasons, its error (an error event, or a 4xx before the stream), and how many events
    had come when `mark` was called."""

    def __init__(self, server: RunningServer, body: dict[str, Any]) -> None:
        self.texts: dict[int, str] = {}
        self.finished: dict[int, str] = {}
        self.error: dict[str, Any] | None = None
        self.status: int | None = None
        self.events = 0
        self.started = threading.Event()  # the first event (or the answer) came
        url = f"{server.api_url}/completions"
        self._thread = threading.Thread(target=self._run, args=(url, {**body, "stream": True}))
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url, json=body, timeout=300) as response:
                self.status = response.status_code
                if response.status_code != 200:
                    self.error = json.loads(response.read())["error"]
                    return
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line.removeprefix("data: "))
                    self.events += 1
                    self.started.set()
                    if "error" in event:
                        self.error = event["error"]
                        return
                    for c in event["choices"]:
                        self.texts[c["index"]] = self.texts.get(c["index"], "") + c["text"]
                        if c["finish_reason"]:
                            self.finished[c["index"]] = c["finish_reason"]
        finally:
            self.started.set()

    def join(self) -> None:
        self._thread.join()


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_a_pathological_grammar_ends_while_another_stream_completes(
    server: RunningServer, name: str
) -> None:
    fields, letter, complete, max_tokens = PATHOLOGICAL[name]
    other = Stream(
        server,
        {"prompt": "The sea at night", "n": 4, "max_tokens": 128, "ignore_eos": True, "seed": 1},
    )
    other.started.wait()
    events_before = other.events
    heavy = Stream(
        server,
        {
            "prompt": "Write it:",
            "n": N,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "logit_bias": [[letter, 100]],
            **fields,
        },
    )
    heavy.join()
    other.join()

    assert other.error is None and other.status == 200, other.error
    assert events_before < other.events  # it was still streaming when the grammar came
    assert other.finished == dict.fromkeys(range(4), "length"), other.finished

    if heavy.error is not None:  # refused (400), or stopped by a limit mid-stream
        message = heavy.error["message"]
        assert "cannot" in message and ("limit" in message or "too" in message), heavy.error
        return
    assert heavy.status == 200 and len(heavy.finished) == N, heavy.finished
    for i, text in heavy.texts.items():
        if heavy.finished[i] == "stop":
            assert re.fullmatch(complete, text), (i, text)
        else:  # cut by max_tokens: only ("a"|"a")* goes on that long
            assert re.fullmatch(r"a+", text) and len(text) >= max_tokens, (i, text)


@pytest.mark.models(SMOLLM2)
def test_a_constraint_that_cannot_go_on_is_the_request_s_error(server: RunningServer) -> None:
    """Found by test_fuzz.py: on SmolLM2's byte tokens, llguidance's mask for this regex
    allows, after U+008E, a byte that its matcher then refuses (U+95FD0 comes next). The
    request's constraint cannot go on: a 400 that says so (whole), an error event of the
    same type and code (streamed), never a 500; the server goes on."""
    body = {"prompt": "x", "max_tokens": 16, "guided_regex": "\x10ã\x83Û\x8e\U00095fd0\x8b"}
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "constraint_failed" and "cannot go on" in error["message"]
    streamed = Stream(server, body)
    streamed.join()
    assert streamed.status == 200 and streamed.error is not None
    assert "cannot go on" in streamed.error["message"]
    # the same client error as the whole answer's (issue 37), not a server_error
    assert (streamed.error["type"], streamed.error["code"]) == (error["type"], error["code"])
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200

"""Banned patterns (`banned_regex`) on the real model and server: no branch holds a match,
streamed or not, with n, best_of, distinct openings and per-branch settings; the 400s;
and patterns that would make a backtracking engine spin do not stall a stream beside them.

Properties only: no greedy text is compared between two requests (tests/support/paths.py).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any

import httpx
import pytest
import re2

from tests.support.server import RunningServer

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"
# Non-default sampler values: the bans must hold whatever the chain does.
SAMPLING = {"temperature": 1.1, "top_k": 60, "top_p": 0.9, "min_p": 0.02, "seed": 17}


def post(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.api_url}/completions", json=body, timeout=600)


def found(patterns: list[str], text: str) -> list[str]:
    return [p for p in patterns if re2.search(f"(?i){p}", text)]


def greedy_patterns(server: RunningServer) -> list[str]:
    """Two patterns greedy decoding matches: a word family from its text, and any word
    after "the" (frequent enough that most branches must be taken back at least once)."""
    reply = post(server, {"prompt": STORY, "max_tokens": 24, "temperature": 0})
    words = [w for w in reply.json()["choices"][0]["text"].split() if w.isalpha() and len(w) > 3]
    assert words, reply.text
    return [rf"\b{words[0][:3]}\w*", r"\bthe \w+"]


def streamed(server: RunningServer, body: dict[str, Any]) -> tuple[dict[int, str], dict[int, str]]:
    shown: dict[int, str] = defaultdict(str)
    finished: dict[int, str] = {}
    with httpx.stream(
        "POST", f"{server.api_url}/completions", json={**body, "stream": True}, timeout=600
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                index = choice["index"]
                shown[index] += choice["text"]
                # never any part of a match: what is shown so far holds none
                assert not found(body["banned_regex"], shown[index]), shown[index]
                if choice["finish_reason"]:
                    finished[index] = choice["finish_reason"]
    return shown, finished


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_no_branch_holds_a_match(server: RunningServer, stream: bool) -> None:
    patterns = greedy_patterns(server)
    body = {"prompt": STORY, "n": 4, "max_tokens": 32, **SAMPLING, "banned_regex": patterns}
    if stream:
        shown, finished = streamed(server, body)
        assert sorted(finished) == [0, 1, 2, 3]
        texts = [shown[i] for i in range(4)]
    else:
        reply = post(server, body)
        assert reply.status_code == 200, reply.text
        texts = [c["text"] for c in reply.json()["choices"]]
    assert len(texts) == 4
    for text in texts:
        assert not found(patterns, text), text


@pytest.mark.parametrize(
    "extra",
    [
        {"n": 2, "best_of": 4},
        {"n": 4, "distinct_openings": True},
        {"n": 3, "choices_params": [{"temperature": 0.3}, {"temperature": 1.4}, {"top_k": 5}]},
    ],
    ids=["best_of", "distinct_openings", "choices_params"],
)
def test_every_way_of_choosing_keeps_the_ban(server: RunningServer, extra: dict[str, Any]) -> None:
    patterns = greedy_patterns(server)
    body = {"prompt": STORY, "max_tokens": 24, **SAMPLING, "banned_regex": patterns, **extra}
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert len(choices) == extra["n"]
    for choice in choices:
        assert not found(patterns, choice["text"]), choice["text"]
    if "best_of" not in extra:  # best_of cannot stream; the rest must hold streamed too
        shown, finished = streamed(server, body)
        assert sorted(finished) == list(range(extra["n"]))
        for text in shown.values():
            assert not found(patterns, text)


def test_case_sensitive_patterns_let_other_cases_through(server: RunningServer) -> None:
    body = {"prompt": STORY, "n": 2, "max_tokens": 24, **SAMPLING}
    reply = post(
        server, {**body, "banned_regex": [r"\bTHE\b"], "banned_strings_case_sensitive": True}
    )
    assert reply.status_code == 200, reply.text
    for choice in reply.json()["choices"]:
        assert "THE" not in choice["text"].split()
    reply = post(server, {**body, "banned_regex": [r"\bTHE\b"]})
    for choice in reply.json()["choices"]:
        assert not re2.search(r"(?i)\bthe\b", choice["text"])


@pytest.mark.parametrize(
    "patterns, named",
    [
        ([r"(?<=her )knuckles"], "(?<=her )knuckles"),
        ([r"\bsea", r"(\w+) \1"], "banned_regex[1]"),
        ([r"[[:alpha:]]+"], "[[:alpha:]]+"),
        (["x" * 257], "at most 256"),
        ([f"a{i}" for i in range(129)], "at most 128"),
    ],
    ids=["look-behind", "back-reference", "posix-class", "too-long", "too-many"],
)
def test_a_pattern_the_engine_cannot_take_is_a_400_naming_it(
    server: RunningServer, patterns: list[str], named: str
) -> None:
    reply = post(server, {"prompt": STORY, "max_tokens": 4, "banned_regex": patterns})
    assert reply.status_code == 400, reply.text
    assert named in reply.json()["error"]["message"]


CATASTROPHIC = [r"(a+)+$", r"(a|aa)+b", r"(.*a){12}", r"(x+x+)+y", r"(\w+\s?)+z"]


def test_catastrophic_patterns_do_not_stall_a_stream_beside_them(server: RunningServer) -> None:
    """A backtracking engine would never end these patterns' scans of 200 a's (their paths
    grow as 2^n), and the engine thread, which every stream shares, would stop with it: so
    the property is that both requests end, with every token of the stream beside them.
    How long each step takes with them is measured, not asserted
    (bench/bench_banned_regex.py)."""
    heavy = {
        "prompt": "a" * 200,
        "n": 8,
        "max_tokens": 48,
        "ignore_eos": True,
        "banned_regex": CATASTROPHIC,
        **SAMPLING,
    }
    done: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: done.append(post(server, heavy)))
    worker.start()
    body = {
        "prompt": STORY,
        "max_tokens": 32,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{server.api_url}/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[len("data: ") :]).get("usage") or usage
    worker.join(timeout=600)
    assert done and done[0].status_code == 200, done and done[0].text
    for choice in done[0].json()["choices"]:
        assert not found(CATASTROPHIC, choice["text"])
        assert choice["finish_reason"] == "length"
    assert usage.get("completion_tokens") == 32, usage

"""Live branching on the API's side without a model: the registry of calls a writer may act
on (api/live.py), and where a fork from a character offset cuts a choice's tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from llama_srb.api.errors import APIError
from llama_srb.api.live import LiveCall, LiveCalls, fork_point
from llama_srb.api.schemas.completions import CompletionRequest
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput, RequestTimes
from llama_srb.engine.spec import RequestSpec
from llama_srb.sampling.params import SamplingParams

WORDS = {10: "The", 11: " cat", 12: " sat", 13: " on", 14: " the", 15: " mat"}


class WordModel:
    """Tokens of whole words; a text that is no token is read one character a token."""

    def text(self, tokens: Sequence[int]) -> str:
        return "".join(WORDS.get(t, chr(t)) for t in tokens)

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return [ord(c) for c in text]


def call(response_id: str = "cmpl-1", client: str = "address:a", prompts: int = 1) -> LiveCall:
    spec = RequestSpec([1, 2, 3], SamplingParams(), n_choices=2)
    body = CompletionRequest(prompt="x", n=2)
    relaunch: Any = lambda body, tokens: None  # noqa: E731
    ids = [f"{response_id}-{i}" for i in range(prompts)]
    return LiveCall(response_id, client, "m", body, relaunch, [spec] * prompts, ids)


def output(position_id: str, index: int, tokens: list[int]) -> RequestOutput:
    delta = ChoiceDelta(index, WordModel().text(tokens), tokens)
    return RequestOutput(position_id, [delta], 2, 3, len(tokens), RequestTimes(0.0))


def test_a_call_gathers_each_choice_as_it_streams_and_maps_indices_to_its_prompts() -> None:
    live = call(prompts=2)
    live.observe(0, output("a", 1, [10, 11]))
    live.observe(1, output("b", 0, [12]))
    live.observe(0, output("a", 1, [12]))
    assert live.text_of(1) == ([10, 11, 12], "The cat sat")
    assert live.text_of(2) == ([12], " sat")  # prompt 1's first choice
    assert live.text_of(3) == ([], "")  # nothing yet
    assert live.locate(3) == (1, 1)
    with pytest.raises(APIError) as missing:
        live.locate(4)
    assert missing.value.status == 404


def test_only_the_caller_finds_its_call_and_ended_calls_are_kept_within_a_bound() -> None:
    calls = LiveCalls(recent=2)
    first, second, third = call("c1"), call("c2"), call("c3")
    for live in (first, second, third):
        calls.open(live)
    assert calls.get("c1", "address:a") is first
    with pytest.raises(APIError) as theirs:
        calls.get("c1", "address:b")
    assert theirs.value.status == 404 and "of yours" in theirs.value.message
    calls.end(first)
    calls.end(second)
    calls.end(first)  # twice: counted once
    running = call("c4")
    calls.open(running)
    calls.end(third)  # a third ended call: the oldest ended one goes
    with pytest.raises(APIError):
        calls.get("c1", "address:a")
    assert calls.get("c2", "address:a") is second and calls.get("c4", "address:a") is running


@pytest.mark.parametrize(
    ("at", "cut"),
    [
        (None, [10, 11, 12, 13]),  # where it stands
        (0, []),
        (7, [10, 11]),  # "The cat": a token boundary
        (9, [10, 11, ord(" "), ord("s")]),  # inside " sat": the rest read anew
        (14, [10, 11, 12, 13]),  # its whole text
    ],
)
def test_a_fork_point_keeps_whole_tokens_up_to_at_and_reads_the_rest(
    at: int | None, cut: list[int]
) -> None:
    tokens = [10, 11, 12, 13]
    assert fork_point(WordModel(), tokens, "The cat sat on", at) == cut  # type: ignore[arg-type]


def test_a_fork_point_past_the_text_is_a_400_naming_at() -> None:
    with pytest.raises(APIError) as past:
        fork_point(WordModel(), [10], "The", 4)  # type: ignore[arg-type]
    assert past.value.status == 400 and past.value.param == "at"


def test_a_page_of_another_origin_cannot_reach_the_live_routes(client: Any) -> None:
    """The origin gate (api/origins.py) refuses another site's page before the route runs;
    without a page (curl, an SDK) an unknown call is simply not found."""
    for method, path in (
        ("POST", "/v1/completions/cmpl-x/choices/0/fork"),
        ("DELETE", "/v1/chat/completions/cmpl-x/choices/0"),
        ("PATCH", "/v1/completions/cmpl-x/choices/0"),
    ):
        page = client.request(method, path, json={}, headers={"Origin": "https://evil.example"})
        assert page.status_code == 403, (method, path, page.text)
        plain = client.request(method, path, json={"temperature": 1})
        assert plain.status_code == 404 and plain.json()["error"]["code"] == "completion_not_found"

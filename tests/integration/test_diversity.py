"""Choosing between branches on the real model and server: banned phrases with rewinds,
best_of, distinct openings and per-branch settings, on each generation route."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import httpx

from tests.support.paths import DRIFT, Step, assert_same_greedy, completion_steps
from tests.support.server import RunningServer

STORY = "The old lighthouse keeper climbed the stairs one last time. At the top, he"
REFRAIN = "He climbed the stairs again."


def post(server: RunningServer, path: str, **body: object) -> Any:
    response = httpx.post(f"{server.base_url}{path}", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()


def complete(server: RunningServer, **body: object) -> dict[str, Any]:
    return post(server, "/v1/completions", **{"prompt": STORY, **body})  # type: ignore[no-any-return]


def texts(out: dict[str, Any]) -> list[str]:
    return [c["text"] for c in out["choices"]]


def fresh_prompt(chapter: int) -> str:
    """The story under a heading of its own (one per test: no other request read it).
    Fixed text, never random: the greedy text these tests compare is checked for near
    ties, a property of the prompt (tests/support/paths.py)."""
    return f"Chapter {chapter}. {STORY}"


def greedy_steps(server: RunningServer, **body: object) -> list[list[Step]]:
    """Each choice's steps of a request asked with `logprobs: 2`."""
    return [completion_steps(c) for c in complete(server, **body, logprobs=2)["choices"]]


def greedy_phrase(server: RunningServer, prompt: str = STORY) -> tuple[str, str]:
    """The greedy continuation, and a two-word phrase from it that greedy decoding writes."""
    greedy = texts(complete(server, prompt=prompt, max_tokens=24, temperature=0))[0]
    words = greedy.split()
    assert len(words) >= 4, greedy
    return greedy, " ".join(words[1:3])


def test_a_banned_phrase_never_appears_in_any_branch(server: RunningServer) -> None:
    prompt = fresh_prompt(11)
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 2}
    (greedy,) = complete(server, **body)["choices"]
    phrase = " ".join(greedy["text"].split()[1:3])
    out = complete(server, prompt=prompt, n=8, max_tokens=24, seed=5, banned_strings=[phrase])
    for choice in out["choices"]:
        assert phrase.lower() not in choice["text"].lower()
        assert choice["finish_reason"] in ("length", "stop") and choice["text"].strip()
    # Greedy decoding, banned from its own phrase, takes another way from where it began:
    # up to there, both wrote the same tokens (a near tie aside: tests/support/paths.py).
    (rewound,) = complete(server, **body, banned_strings=[phrase])["choices"]
    assert phrase.lower() not in rewound["text"].lower() and rewound["text"] != greedy["text"]
    start = greedy["text"].lower().index(phrase.lower())
    offsets = greedy["logprobs"]["text_offset"]
    before = sum(1 for offset in offsets if offset < start)
    steps = [completion_steps(c)[:before] for c in (greedy, rewound)]
    if assert_same_greedy(*steps, at_least=0) == before:
        assert rewound["text"].startswith(greedy["text"][:start])


def test_a_streamed_branch_never_shows_any_of_a_banned_phrase(server: RunningServer) -> None:
    _, phrase = greedy_phrase(server)
    shown: dict[int, str] = defaultdict(str)
    finished: dict[int, str] = {}
    body = {"prompt": STORY, "n": 8, "max_tokens": 24, "seed": 9, "stream": True}
    body |= {"banned_strings": [phrase.upper()], "logprobs": 1}  # case does not matter
    with httpx.stream("POST", f"{server.api_url}/completions", json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                index = choice["index"]
                shown[index] += choice["text"]
                assert phrase.lower() not in shown[index].lower()
                # tokens go out with their text, never ahead of it
                tokens = (choice.get("logprobs") or {}).get("tokens") or []
                assert "".join(tokens) == choice["text"]
                if choice["finish_reason"]:
                    finished[index] = choice["finish_reason"]
    assert sorted(finished) == list(range(8)) and all(shown[i] for i in range(8))


def test_banned_strings_case_sensitive_lets_other_cases_through(server: RunningServer) -> None:
    # A refrain greedy decoding repeats with confidence: the unbanned case must come back
    # word for word, and a near tie elsewhere in the story could round the other way.
    prompt = f"{fresh_prompt(12)} saw a light. {REFRAIN} {REFRAIN} {REFRAIN}"
    _, phrase = greedy_phrase(server, prompt)
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
    body["banned_strings"] = [phrase.swapcase()]
    strict = texts(complete(server, **body, banned_strings_case_sensitive=True))[0]
    assert phrase in strict  # the phrase as written is another string
    loose = texts(complete(server, **body))[0]
    assert phrase.lower() not in loose.lower()


def test_best_of_returns_the_n_branches_with_the_highest_mean_logprob(
    server: RunningServer,
) -> None:
    body = {"prompt": fresh_prompt(13), "max_tokens": 12, "seed": 21, "logprobs": 1}
    body["ignore_eos"] = True
    complete(server, prompt=body["prompt"], max_tokens=1)  # both fork it from the cache
    best = complete(server, n=2, best_of=6, **body)
    every = complete(server, n=6, **body)  # the same six branches (seeds seed + i)

    def mean(choice: dict[str, Any]) -> float:
        scores = choice["logprobs"]["token_logprobs"]
        return sum(scores) / len(scores)

    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert mean(best["choices"][0]) >= mean(best["choices"][1])
    # Usage counts every generated token, the four branches not returned included.
    assert best["usage"]["completion_tokens"] == 6 * 12
    # The two best of the same six branches. A near tie can send a seeded branch another
    # way when the prompt's cells sit elsewhere (README, Known limits), and two means
    # within the paths' drift may rank either way: a branch both requests sampled alike
    # is returned only if no other branch of the six beat it by more than that.
    means = {c["text"]: mean(c) for c in every["choices"]}
    for choice in best["choices"]:
        if choice["text"] in means:
            beaten_by = sorted(means.values(), reverse=True)[2]
            assert means[choice["text"]] >= beaten_by - DRIFT


def test_best_of_is_bounded_and_never_streamed(server: RunningServer) -> None:
    for body, status in [
        ({"n": 3, "best_of": 2}, 400),
        ({"n": 1, "best_of": 1000}, 400),
        ({"n": 1, "best_of": 3, "stream": True}, 400),
    ]:
        r = httpx.post(f"{server.api_url}/completions", json={"prompt": STORY, **body}, timeout=60)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == "best_of"


def test_distinct_openings_start_every_branch_differently(server: RunningServer) -> None:
    body = {"n": 8, "max_tokens": 3, "seed": 4, "logprobs": 1}
    out = complete(server, distinct_openings=True, **body)
    firsts = [c["logprobs"]["tokens"][0] for c in out["choices"]]
    assert len(set(firsts)) == 8, firsts
    # Greedy branches too: the 8 most likely first tokens, each continued greedily.
    greedy = complete(server, distinct_openings=True, **body, temperature=0)
    assert len({c["logprobs"]["tokens"][0] for c in greedy["choices"]}) == 8


def test_per_branch_temperature_zero_gives_that_branch_the_greedy_text(
    server: RunningServer,
) -> None:
    # llama.cpp's sums round differently for batches of other shapes and for other rows of
    # a batch, which can flip a near tie: the greedy reference is the same row of a batch
    # of the same shape (4 branches that all run to max_tokens; a choices_params entry
    # keeps a greedy request from being decoded as one branch).
    prompt = f"{fresh_prompt(14)} saw a light. {REFRAIN} He climbed the"  # sure of what comes
    body = {"prompt": prompt, "n": 4, "max_tokens": 16, "ignore_eos": True}
    # Both read the prompt from the cache (its last token decoded again alone): the first
    # to read a prompt computes it in a batch of another shape (CI saw a tie flip there).
    complete(server, **{**body, "n": 1, "max_tokens": 1})
    greedy = greedy_steps(server, **body, temperature=0, choices_params=[{"temperature": 0}])
    out = greedy_steps(
        server, **body, seed=8, temperature=1.2, choices_params=[{}, {"temperature": 0}]
    )
    assert_same_greedy(out[1], greedy[1])
    assert any(steps != greedy[1] for i, steps in enumerate(out) if i != 1)


def test_choices_params_are_validated_like_the_fields(server: RunningServer) -> None:
    for entries, param in [
        ([{"temperature": -1}], "choices_params[0].temperature"),
        ([{}, {"max_tokens": 5}], "choices_params[1].max_tokens"),
        ([{"top_k": "many"}], "choices_params[0].top_k"),
    ]:
        body = {"prompt": STORY, "n": 2, "choices_params": entries}
        r = httpx.post(f"{server.api_url}/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_chat_and_native_routes_take_the_same_fields(server: RunningServer) -> None:
    _, phrase = greedy_phrase(server)
    chat = post(
        server,
        "/v1/chat/completions",
        messages=[{"role": "user", "content": "Tell me about a lighthouse."}],
        n=3,
        best_of=4,
        max_tokens=12,
        seed=2,
        distinct_openings=True,
        choices_params=[{"temperature": 0.5}],
    )
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    native = post(
        server,
        "/completion",
        prompt=STORY,
        n=3,
        n_predict=16,
        seed=3,
        banned_strings=[phrase],
        distinct_openings=True,
        return_tokens=True,
    )
    assert len(native) == 3
    assert len({r["tokens"][0] for r in native}) == 3
    assert all(phrase.lower() not in r["content"].lower() for r in native)

"""The browser UI's controls for choosing between branches: banned phrases, best_of,
distinct openings and the temperature spread, sent with each generation and kept in local
storage, in a real headless chromium against the real server and model."""

from __future__ import annotations

from typing import Any

import pytest
import re2

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import PROMPT, card_text, expect, set_settings, wait_finished
from tests.support.server import RunningServer

# The page, not the model, is under test (the features' effect on text is tested through
# the API in test_diversity.py).
pytestmark = pytest.mark.models(GEMMA)


def sent_bodies(page: Any) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []

    def on_request(request: Any) -> None:
        if request.url.endswith("/v1/completions") and request.method == "POST":
            bodies.append(request.post_data_json)

    page.on("request", on_request)
    return bodies


def test_choosing_controls_reach_the_request_and_are_kept(
    open_ui: Any, server: RunningServer
) -> None:
    page = open_ui(server.base_url)
    bodies = sent_bodies(page)
    set_settings(page, n=3, max_tokens=8, seed=5, temperature=0.8, spread=0.4, best_of=4)
    page.get_by_test_id("setting-distinct_openings").check()
    page.get_by_test_id("setting-banned_strings").fill("the sea\n Suddenly")
    page.get_by_test_id("setting-banned_regex").fill(r"\bwav\w*" + "\n" + r"\bthe \w+")
    page.get_by_test_id("story").fill(PROMPT)
    page.get_by_test_id("generate").click()
    cards = wait_finished(page, 3)

    (body,) = bodies
    assert body["banned_strings"] == ["the sea", " Suddenly"]
    assert body["banned_regex"] == [r"\bwav\w*", r"\bthe \w+"]  # as typed: no unescaping
    assert body["best_of"] == 4 and body["distinct_openings"] is True
    # The spread: 4 branches from 0.8 - 0.4 to 0.8 + 0.4, evenly.
    temps = [entry["temperature"] for entry in body["choices_params"]]
    assert temps == pytest.approx([0.4, 0.667, 0.933, 1.2], abs=1e-3)
    assert "stream" not in body  # best_of is answered whole
    assert "spread" not in body
    for card in cards:
        assert "the sea" not in card["text"].lower() and "suddenly" not in card["text"].lower()
        assert not re2.search(r"(?i)\bwav\w*|\bthe \w+", card["text"])
    expect(card_text(page, 0)).not_to_have_value("")

    # Kept across a reload (local storage), and sent again as they were.
    page.reload()
    expect(page.get_by_test_id("setting-distinct_openings")).to_be_checked()
    expect(page.get_by_test_id("setting-banned_strings")).to_have_value("the sea\n Suddenly")
    expect(page.get_by_test_id("setting-banned_regex")).to_have_value("\\bwav\\w*\n\\bthe \\w+")
    expect(page.get_by_test_id("setting-spread")).to_have_value("0.4")
    expect(page.get_by_test_id("setting-best_of")).to_have_value("4")

    # Off again: none of the fields is sent, and the answer streams.
    page.get_by_test_id("setting-distinct_openings").uncheck()
    set_settings(page, spread=0, best_of="")
    page.get_by_test_id("setting-banned_strings").fill("")
    page.get_by_test_id("setting-banned_regex").fill("")
    page.get_by_test_id("story").fill(PROMPT)
    page.get_by_test_id("generate").click()
    wait_finished(page, 3)
    last = bodies[-1]
    assert last["stream"] is True
    off = {"best_of", "distinct_openings", "banned_strings", "banned_regex", "choices_params"}
    assert not off & set(last)

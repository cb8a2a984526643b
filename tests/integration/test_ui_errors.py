"""Keys do what the writer means, and a refused request costs nothing (issue 13, defects
4, 5 and 6): the good continuations stay, empty cards cannot be used, the server's own
limits and messages reach the form, and the field at fault is marked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    PROMPT,
    card_text,
    cards,
    expect,
    expect_current,
    set_settings,
    start_story,
    wait_finished,
)
from tests.support.server import RunningServer

# The page, not the model, is under test here: it runs on the default model, the base
# model for continuing stories the page is made for; both models' answers to the same
# requests are tested through the API (test_completions.py, test_logprobs.py...).
pytestmark = pytest.mark.models(GEMMA)


def test_ctrl_enter_in_an_edited_card_uses_that_card(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    first = start_story(page, n=2, max_tokens=3, seed=5)
    edited = first[1]["text"] + " Yes."
    card_text(page, 1).fill(edited)
    card_text(page, 1).press("Control+Enter")
    expect_current(page, 2)
    expect(page.get_by_test_id("story")).to_have_value(PROMPT + edited)
    wait_finished(page, 2)
    expect(page.get_by_test_id("tree-node")).to_have_count(2)


def test_a_refused_request_keeps_the_continuations(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    good = start_story(page, n=2, max_tokens=3, seed=6)

    # More continuations than this server allows: its message, the field marked, nothing lost.
    set_settings(page, n=100)
    page.get_by_test_id("retry").click()
    status = page.get_by_test_id("status")
    expect(status).to_contain_text("n must be between 1 and 64, got 100")
    n_field = page.get_by_test_id("setting-n")
    expect(n_field).to_have_attribute("aria-invalid", "true")
    expect(n_field).to_have_attribute("max", "64")  # the server's limit, from its answer
    expect(page.get_by_test_id("setting-error").first).to_have_text(
        "n must be between 1 and 64, got 100"
    )
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    expect(cards(page)).to_have_count(2)
    for i, choice in enumerate(good):
        expect(card_text(page, i)).to_have_value(choice["text"])
        expect(cards(page).nth(i).get_by_test_id("use")).to_be_enabled()

    # The form now knows the limit itself; fixing the field clears the mark.
    page.get_by_test_id("generate").click()
    expect(status).to_contain_text("n:")
    set_settings(page, n=2)
    expect(n_field).not_to_have_attribute("aria-invalid", "true")

    # Continuations that came back empty cannot be used (every word ends at a stop string).
    letters = "abcdefghijklmnopqrstuvwxyz"
    stops = "\n".join([" ", "\\n", *letters, *letters.upper(), *".,'\"!?"])
    set_settings(page, stop=stops, max_tokens=4)
    page.get_by_test_id("retry").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(2)
    wait_finished(page, 2)
    for i in range(2):
        expect(card_text(page, i)).to_have_value("")
        expect(cards(page).nth(i).get_by_test_id("use")).to_be_disabled()


def test_a_server_error_names_and_marks_its_setting(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    page.get_by_test_id("story").fill(PROMPT)

    # A 400 naming its parameter: the field is marked with the server's words.
    set_settings(page, n=1, max_tokens=2, top_k=999999)
    page.get_by_test_id("generate").click()
    expect(page.get_by_test_id("status")).to_contain_text("top_k must be")
    expect(page.get_by_test_id("setting-top_k")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_test_id("tree-node")).to_have_count(0)
    set_settings(page, top_k=40)

    # A 500 whose message names a setting (as DRY's once did): that field is marked.
    def fail(route: Any) -> None:
        body = {"error": {"message": "internal error: dry_base broke the sampler", "param": None}}
        route.fulfill(status=500, content_type="application/json", body=json.dumps(body))

    page.route("**/v1/completions", fail)
    page.get_by_test_id("generate").click()
    expect(page.get_by_test_id("status")).to_have_text(
        "Server: internal error: dry_base broke the sampler (see dry_base under Settings)"
    )
    expect(page.get_by_test_id("setting-dry_base")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_test_id("setting-top_k")).not_to_have_attribute("aria-invalid", "true")
    expect(page.get_by_test_id("story")).to_have_value(PROMPT)  # the draft is still there

"""Live branching in the workbench (issue 44): while n cards stream, one is dropped and
refilled, one is forked from the caret (its node a child in the tree at that point), and
one is steered by typing into it, the others streaming on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    GENERATION_TIMEOUT_MS,
    card_text,
    cards,
    expect,
    expect_current,
    exported_tree,
    set_settings,
    tree_node,
    wait_until,
    with_ignore_eos,
)
from tests.support.server import RunningServer

# The page, not the model, is under test here (test_live_branching.py tests the API on
# both models): the default model, the base model the page is made for.
pytestmark = pytest.mark.models(GEMMA)

STORY = "Count slowly from one to one thousand: one, two, three,"
WORDS = " Then the lighthouse went dark"
# With ignore_eos the cards stream until Stop (this many take a quiet machine most of a
# minute). Small enough that the fork's two fit beside the four (a refill's included) in
# the context large requests may take (7/8 of it): a fork that does not fit waits.
MAX_TOKENS = 1000


def grows(locator: Any) -> None:
    """Waits until the card's text gets longer than it is now: it still streams."""
    before = len(locator.input_value())
    wait_until(lambda: len(locator.input_value()) > before + 4, GENERATION_TIMEOUT_MS / 1000)


def test_drop_fork_and_steer_streaming_cards(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    page.route("**/v1/completions", with_ignore_eos)
    set_settings(page, n=3, max_tokens=MAX_TOKENS)
    page.get_by_test_id("story").fill(STORY)
    page.get_by_test_id("generate").click()
    for i in range(3):
        expect(card_text(page, i)).not_to_have_value("", timeout=GENERATION_TIMEOUT_MS)
        expect(cards(page).nth(i).get_by_test_id("drop")).to_be_visible()

    # Drop & refill the third: it ends "dropped", a fourth card streams in its place.
    cards(page).nth(2).get_by_test_id("drop-refill").click()
    expect(cards(page).nth(2).get_by_test_id("finish-reason")).to_have_text("dropped")
    expect(cards(page)).to_have_count(4)
    expect(card_text(page, 3)).not_to_have_value("", timeout=GENERATION_TIMEOUT_MS)
    dropped = card_text(page, 2).input_value()
    # A plain Drop of the refill: the other two stream on.
    cards(page).nth(3).get_by_test_id("drop").click()
    expect(cards(page).nth(3).get_by_test_id("finish-reason")).to_have_text("dropped")
    grows(card_text(page, 0))
    assert card_text(page, 2).input_value() == dropped
    expect(cards(page).nth(2).get_by_test_id("drop")).to_be_hidden()

    # Steer the first by typing into it: the words wait in the line at its end (sent by
    # Enter, or by a pause), go in once, and the model writes on. (Once: counted as the
    # page sends them; the model may well write them again itself, as a base model
    # repeating a sentence did in a CI run.)
    steers: list[object] = []
    page.on(
        "request",
        lambda r: steers.append(r.post_data_json) if "/choices/" in r.url else None,
    )
    card_text(page, 0).press_sequentially(WORDS)
    expect(cards(page).nth(0).get_by_test_id("steer")).to_be_focused()
    page.keyboard.press("Enter")
    expect(card_text(page, 0)).to_have_value(
        re.compile(re.escape(WORDS)), timeout=GENERATION_TIMEOUT_MS
    )
    assert steers == [{"append": WORDS}]
    expect(cards(page).nth(0).get_by_test_id("steer")).to_have_value("")
    wait_until(
        lambda: len(card_text(page, 0).input_value().split(WORDS, 1)[1]) > 4,
        GENERATION_TIMEOUT_MS / 1000,
    )

    # Fork the second from a caret placed in its text, k = the form's n: a child node of
    # two streaming cards, while the view stays on the cards it came from.
    set_settings(page, n=2)
    second = card_text(page, 1)
    second.click(position={"x": 60, "y": 12})
    at = second.evaluate("t => t.selectionStart")
    head = second.input_value()[:at]
    fork = cards(page).nth(1).get_by_test_id("fork")
    expect(fork).to_have_text("Fork here")
    fork.click()
    expect(tree_node(page, 2)).to_be_visible()
    expect_current(page, 1)
    expect(cards(page).nth(1).get_by_test_id("branches")).to_have_text("branched 1×")
    grows(card_text(page, 1))
    tree_node(page, 2).click()
    expect(page.get_by_test_id("story")).to_have_value(STORY + head)
    expect(cards(page)).to_have_count(2)
    for i in range(2):
        expect(card_text(page, i)).not_to_have_value("", timeout=GENERATION_TIMEOUT_MS)
        expect(cards(page).nth(i).get_by_test_id("finish-reason")).to_have_text("streaming…")

    # Stop ends the generation and its fork; the tree keeps what happened.
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("generate")).to_be_enabled()
    wait_until(lambda: server.metric("llama_srb_sequences_running") == 0)
    nodes = {node["id"]: node for node in exported_tree(page)["nodes"]}
    assert (nodes[2]["parent"], nodes[2]["via"], nodes[2]["text"]) == (1, 1, STORY + head)
    assert nodes[2]["params"]["n"] == 2 and len(nodes[2]["choices"]) == 2
    reasons = [c["finish_reason"] for c in nodes[1]["choices"]]
    assert reasons[2:] == ["dropped", "dropped"] and "dropped" not in reasons[:2], reasons
    assert WORDS in nodes[1]["choices"][0]["text"]

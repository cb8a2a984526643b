"""Branching at the word (issue 13): with logprobs on, each generated word shows its
probability and alternatives; a click regenerates from there, takes the card up to there,
or continues with an alternative, and the server is sent exactly the text up to that word.
Also memory and author's note ("what is sent"), the writer's words marked apart from the
model's, and undo / redo / one-key retry."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    PROMPT,
    cards,
    expect,
    expect_current,
    exported_tree,
    screenshot,
    sent_prompts,
    start_story,
    wait_finished,
)
from tests.support.server import RunningServer

# The page, not the model, is under test here: it runs on the default model, the base
# model for continuing stories the page is made for; both models' answers to the same
# requests are tested through the API (test_completions.py, test_logprobs.py...).
pytestmark = pytest.mark.models(GEMMA)

PERCENT = re.compile(r"^\d+(\.\d)?%$")


def words(page: Any, card: int) -> list[str]:
    spans = cards(page).nth(card).get_by_test_id("word")
    return [str(t) for t in spans.evaluate_all("spans => spans.map(s => s.textContent)")]


def prompt_tokens(server: RunningServer, text: str) -> int:
    body = {"content": text, "add_special": True}
    return len(httpx.post(f"{server.base_url}/tokenize", json=body, timeout=10).json()["tokens"])


def node_stats(page: Any, node_id: int) -> dict[str, Any]:
    nodes = {n["id"]: n for n in exported_tree(page)["nodes"]}
    return dict(nodes[node_id]["stats"])


def test_words_show_probabilities_and_branch_where_clicked(
    open_ui: Any, server: RunningServer, tmp_path: Path
) -> None:
    page = open_ui(server.base_url)
    prompts = sent_prompts(page)
    start_story(page, n=2, max_tokens=6, seed=9, logprobs=3)
    first = words(page, 0)
    assert (
        len(first) >= 4
        and "".join(first) == cards(page).nth(0).get_by_test_id("continuation-text").input_value()
    )

    # Hover: the word's probability and the alternatives the model weighed.
    word = cards(page).nth(0).get_by_test_id("word").nth(3)
    word.hover()
    menu = page.get_by_test_id("word-menu")
    expect(menu).to_be_visible()
    expect(menu.get_by_test_id("word-probability")).to_have_text(PERCENT)
    expect(menu.get_by_test_id("alternative").first).to_be_visible()
    page.mouse.move(0, 0)
    expect(menu).to_be_hidden()

    # The keyboard reaches the words too: → → moves to the second word, Enter opens its menu.
    cards(page).nth(0).get_by_test_id("continuation-words").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    expect(menu.get_by_test_id("regenerate-here")).to_be_focused()
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(cards(page).nth(0).get_by_test_id("word").nth(1)).to_be_focused()

    # Click: regenerate from that word. The prompt ends just before it, server side too.
    word.click()
    screenshot(page, "words.png", tmp_path, keep_hover=True)
    menu.get_by_test_id("regenerate-here").click()
    before = PROMPT + "".join(first[:3])
    expect_current(page, 2)
    expect(page.get_by_test_id("story")).to_have_value(before)
    wait_finished(page, 2)
    assert prompts[-1] == before
    assert node_stats(page, 2)["prompt_tokens"] == prompt_tokens(server, before)

    # Take a card only up to a word (its third), then continue with an alternative word.
    second = words(page, 1)
    cards(page).nth(1).get_by_test_id("word").nth(2).click()
    menu.get_by_test_id("use-to-here").click()
    up_to = before + "".join(second[:3])
    expect_current(page, 3)
    wait_finished(page, 2)
    assert prompts[-1] == up_to
    third = words(page, 0)
    cards(page).nth(0).get_by_test_id("word").nth(1).click()
    alternative = menu.get_by_test_id("alternative").first
    alt_text = alternative.inner_text().replace("␣", " ").replace("↵", "\n")
    alternative.click()
    expect_current(page, 4)
    wait_finished(page, 2)
    assert prompts[-1] == up_to + third[0] + alt_text

    # "Edit" turns a card's words back into text to change.
    card = cards(page).nth(1)
    card.get_by_test_id("edit").click()
    expect(card.get_by_test_id("continuation-words")).to_be_hidden()
    card.get_by_test_id("continuation-text").press("End")
    card.get_by_test_id("continuation-text").press_sequentially(" Ha.")
    expect(card.get_by_test_id("edited")).to_be_visible()

    # The model's words are marked apart from the writer's in the story.
    marks = page.get_by_test_id("story-marks").locator("mark.by-model")
    assert (
        "".join(marks.all_text_contents()) == "".join(first[:3] + second[:3]) + third[0] + alt_text
    )


def test_memory_and_authors_note_are_sent_and_shown(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    prompts = sent_prompts(page)
    story = "The storm broke at dawn.\nThe keeper lit the lamp.\nA boat came in."
    page.get_by_text("Memory and author's note").click()
    page.get_by_test_id("memory").fill("This is a gentle story for children.")
    page.get_by_test_id("authors-note").fill("[Tone: hopeful]")
    page.get_by_test_id("note-depth").fill("1")
    page.get_by_test_id("story").fill(story)
    page.get_by_text("What is sent").click()
    expected = (
        "This is a gentle story for children.\n"
        "The storm broke at dawn.\nThe keeper lit the lamp.\n[Tone: hopeful]\nA boat came in."
    )
    expect(page.get_by_test_id("sent-prompt")).to_have_text(expected)
    start_story(page, story, n=1, max_tokens=2)
    assert prompts == [expected]
    expect(page.get_by_test_id("story")).to_have_value(story)
    expect(page.get_by_test_id("node-settings")).to_contain_text("memory")
    expect(page.get_by_test_id("node-settings")).to_contain_text("author's note")


def test_undo_redo_and_one_key_retry(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    first = start_story(page, n=2, max_tokens=3, seed=10)
    body = page.locator("body")

    # Alt+R: new continuations beside the old ones; Ctrl+Z takes them back, Ctrl+Shift+Z again.
    body.press("Alt+r")
    expect_current(page, 2)
    retried = wait_finished(page, 2)
    body.press("Control+z")
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    expect_current(page, 1)
    expect(cards(page).nth(0).get_by_test_id("continuation-text")).to_have_value(first[0]["text"])
    body.press("Control+Shift+z")
    expect_current(page, 2)
    expect(cards(page).nth(1).get_by_test_id("continuation-text")).to_have_value(retried[1]["text"])

    # Undo after "Use this" goes back to the cards the writer chose from.
    cards(page).nth(0).get_by_test_id("use").click()
    expect_current(page, 3)
    wait_finished(page, 2)
    page.get_by_test_id("undo").click()
    expect_current(page, 2)
    expect(page.get_by_test_id("story")).to_have_value(PROMPT)
    expect(page.get_by_test_id("tree-node")).to_have_count(2)

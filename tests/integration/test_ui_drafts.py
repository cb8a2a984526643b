"""The writer's own words are never lost (issue 13, defect 1), the story shows its newest
text (defect 7), and the page keeps its place and its numbers (defect 9)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    PHONE,
    PROMPT,
    card_text,
    cards,
    corners,
    expect,
    expect_current,
    exported_tree,
    in_viewport,
    library_row,
    sent_prompts,
    start_story,
    story_id,
    tree_node,
    wait_finished,
)
from tests.support.server import RunningServer

# The page, not the model, is under test here: it runs on the default model, the base
# model for continuing stories the page is made for; both models' answers to the same
# requests are tested through the API (test_completions.py, test_logprobs.py...).
pytestmark = pytest.mark.models(GEMMA)

TYPED = " Tom wrote back at once."


def test_typing_is_kept_through_use_navigation_reload_and_new_story(
    open_ui: Any, server: RunningServer
) -> None:
    page = open_ui(server.base_url)
    story = page.get_by_test_id("story")
    first = start_story(page, n=2, max_tokens=4, seed=1)

    # Type at the end of a story that already has continuations; a reload keeps the draft.
    story.press("End")
    story.press_sequentially(TYPED)
    expect(page.get_by_test_id("draft-state")).to_be_visible()
    page.reload()
    expect(story).to_have_value(PROMPT + TYPED)
    expect(page.get_by_test_id("draft-state")).to_be_visible()

    # "Use this" after typing at the end: the card followed the text before the typing, so
    # the page asks; added anyway, it goes after the typing, which is a node of its own.
    cards(page).nth(0).get_by_test_id("use").click()
    expect(page.get_by_role("dialog")).to_contain_text("Your edit changed the end of the story")
    page.get_by_test_id("ask-append").click()
    expect(page.get_by_test_id("notice")).to_have_text(
        "Your edit of the story is kept in the tree as #2."
    )
    expect_current(page, 3)
    expect(story).to_have_value(PROMPT + TYPED + first[0]["text"])
    wait_finished(page, 2)
    tree_node(page, 2).click()
    expect(story).to_have_value(PROMPT + TYPED)
    expect(tree_node(page, 2)).to_have_attribute("data-kind", "writer")

    # Going elsewhere keeps an edit too, as a new node under the one it was typed on.
    tree_node(page, 3).click()
    story.press("End")
    story.press_sequentially(" The end.")
    tree_node(page, 1).click()
    expect(page.get_by_test_id("notice")).to_contain_text("#4")
    expect(story).to_have_value(PROMPT)
    tree_node(page, 4).click()
    expect(story).to_have_value(PROMPT + TYPED + first[0]["text"] + " The end.")
    nodes = {n["id"]: n for n in exported_tree(page)["nodes"]}
    assert (nodes[2]["parent"], nodes[3]["parent"], nodes[4]["parent"]) == (1, 2, 3)
    assert nodes[2]["text"] == PROMPT + TYPED
    assert (nodes[3]["via"], nodes[3]["via_node"]) == (0, 1)  # card 1 of #1, after the edit

    # A new story is a story of its own in the library; its draft survives a reload.
    first_id = story_id(page)
    page.get_by_test_id("new-story").click()
    expect(story).to_have_value("")
    story.fill("A new tale begins")
    page.reload()
    expect(story).to_have_value("A new tale begins")
    expect(page.get_by_test_id("tree-node")).to_have_count(0)
    new_id = story_id(page)
    page.get_by_test_id("to-library").click()
    expect(library_row(page, first_id)).to_contain_text("The lighthouse keeper found")
    expect(library_row(page, first_id)).to_contain_text("4 nodes")
    expect(library_row(page, new_id)).to_be_visible()


def test_a_cut_before_use_this_holds(open_ui: Any, server: RunningServer) -> None:
    """Issue 30: a cut in the story box came back after "Use this". A cut well before the
    end keeps the card's place: it is added at once, after the cut; a cut of the end (the
    text the card followed) asks, and "Generate for my text" continues the cut story."""
    page = open_ui(server.base_url)
    story = page.get_by_test_id("story")
    opening = "Bad weather, and worse news. "
    first = start_story(page, opening + PROMPT, n=2, max_tokens=4, seed=3)
    story.fill(PROMPT)  # the first sentence cut
    cards(page).nth(1).get_by_test_id("use").click()
    expect_current(page, 3)
    expect(story).to_have_value(PROMPT + first[1]["text"])  # the cut stays cut
    wait_finished(page, 2)
    expect(tree_node(page, 2)).to_contain_text("cut “Bad weather, and worse news.”")

    # Now cut the end: the cards followed it, so the page asks.
    text = story.input_value()
    story.fill(text[: -len(first[1]["text"])])
    prompts = sent_prompts(page)
    cards(page).nth(0).get_by_test_id("use").click()
    page.get_by_test_id("ask-generate").click()
    wait_finished(page, 2)
    assert prompts == [PROMPT], prompts  # the cut story itself, continued


def long_story(lines: int = 14) -> str:
    return "\n".join(f"Line {i}: the tide came in and went out again." for i in range(lines))


def story_at_end(page: Any) -> bool:
    return bool(
        page.get_by_test_id("story").evaluate(
            "s => s.scrollHeight > s.clientHeight && s.scrollTop + s.clientHeight >= s.scrollHeight - 2"
        )
    )


def test_story_shows_its_end_on_a_phone(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url, **PHONE)
    story = page.get_by_test_id("story")
    start_story(page, long_story(), n=2, max_tokens=4, seed=2)
    assert story_at_end(page)

    # After "Use this" the new text is in view, inside the box and on the page.
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    cards(page).nth(1).get_by_test_id("use").click()
    expect_current(page, 2)
    assert story_at_end(page)
    assert in_viewport(page, story), (story.bounding_box(), page.evaluate("scrollY"))
    wait_finished(page, 2)

    page.reload()
    expect(story).not_to_have_value("")
    assert story_at_end(page)
    # No keyboard hints on a phone, nothing wider than the screen.
    expect(page.locator("kbd").first).to_be_hidden()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_desktop_cards_rows_place_and_stats(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    expect(page.locator('link[rel="icon"]')).to_have_count(1)  # no /favicon.ico 404
    start_story(page, n=4, max_tokens=3, seed=4)

    # Four cards at 1280 px: two rows of two, not three and one.
    places = corners(cards(page))
    xs, ys = sorted({x for x, _ in places}), sorted({y for _, y in places})
    assert len(places) == 4 and len(xs) == 2 and len(ys) == 2, places

    # "Use this" keeps the story and the top bar where they were.
    first_stats = page.get_by_test_id("stats-ttft").inner_text()
    assert re.fullmatch(r"\d+ ms", first_stats)
    cards(page).nth(2).get_by_test_id("use").click()
    wait_finished(page, 4)
    assert page.evaluate("window.scrollY") == 0
    assert in_viewport(page, page.get_by_test_id("story"))

    # The top bar shows the shown node's numbers, after a reload too.
    page.reload()
    expect(page.get_by_test_id("stats-ttft")).to_have_text(re.compile(r"^\d+ ms$"))
    tree_node(page, 1).click()
    expect(page.get_by_test_id("stats-ttft")).to_have_text(first_stats)
    page.get_by_test_id("new-story").click()
    expect(page.get_by_test_id("stats-ttft")).to_have_text("–")
    expect(card_text(page, 0)).to_have_count(0)

"""The server's answer to the page's own save carries that save back: it is no change made
elsewhere. A writer who deletes a node (or brings one back with Undo) while the save that
carried it is still on its way gets no "This story changed elsewhere too" question, and the
story saves. (Under load this race made the library's and tree's tests fail now and then:
the question held the save, the page stayed on "Saving…".) The save's answer is held
back with the page's own request routing, so the race happens every time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    cards,
    expect,
    saved,
    start_story,
    story_id,
    wait_finished,
    wait_until,
)
from tests.support.server import RunningServer

pytestmark = pytest.mark.models(GEMMA)  # the page is under test, not the model


def hold_saves(page: Any) -> tuple[list[Any], Callable[[], None]]:
    """Hold every story save (PATCH) until the returned release is called."""
    held: list[Any] = []
    holding = [True]

    def route(request_route: Any) -> None:
        if request_route.request.method == "PATCH" and holding[0]:
            held.append(request_route)
        else:
            request_route.continue_()

    def release() -> None:
        holding[0] = False
        for request_route in held:
            request_route.continue_()

    page.route("**/v1/stories/*", route)
    return held, release


def until_held(page: Any, held: list[Any]) -> None:
    """Wait, letting the page run (its routes are served only while it does), until a
    save is held and the page says it is saving."""
    wait_until(lambda: page.get_by_test_id("save-state").inner_text() == "Saving…" and bool(held))


def test_a_node_deleted_while_its_save_is_on_the_way_is_no_clash(
    open_ui: Any, server: RunningServer
) -> None:
    page = open_ui(server.base_url)
    start_story(page, n=2, max_tokens=4, seed=8)
    saved(page)
    held, release = hold_saves(page)
    cards(page).nth(1).get_by_test_id("use").click()
    wait_finished(page, 2)
    until_held(page, held)
    page.get_by_test_id("delete-node").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    release()
    saved(page)
    expect(page.get_by_role("dialog")).to_be_hidden()


def test_a_node_brought_back_while_its_deletion_is_on_the_way_is_no_clash(
    open_ui: Any, server: RunningServer
) -> None:
    page = open_ui(server.base_url)
    start_story(page, n=2, max_tokens=4, seed=8)
    cards(page).nth(1).get_by_test_id("use").click()
    wait_finished(page, 2)
    saved(page)
    held, release = hold_saves(page)
    page.get_by_test_id("delete-node").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    until_held(page, held)
    page.get_by_test_id("undo").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(2)
    release()
    saved(page)
    expect(page.get_by_role("dialog")).to_be_hidden()


def test_an_edited_card_is_not_called_saved_before_its_save(
    open_ui: Any, server: RunningServer
) -> None:
    """A card's edit is committed once typing pauses (400 ms): from the keystroke the page
    says "Saving…", not the last save's "Saved" (a writer closing the tab on "Saved", or a
    test waiting for it, would otherwise go on before the edit reached the server)."""
    page = open_ui(server.base_url)
    start_story(page, n=2, max_tokens=4, seed=9)
    saved(page)
    # the edit and the status read in one turn of the page: no save can land between them
    status = page.evaluate(
        """() => {
            const box = document.querySelector('[data-testid="continuation-text"]');
            box.value += " and the tide.";
            box.dispatchEvent(new Event("input", { bubbles: true }));
            return document.querySelector('[data-testid="save-state"]').textContent;
        }"""
    )
    assert status == "Saving…"
    saved(page)
    sid = story_id(page)
    story = httpx.get(f"{server.api_url}/stories/{sid}", timeout=30).json()
    assert any(c["text"].endswith(" and the tide.") for n in story["nodes"] for c in n["choices"])

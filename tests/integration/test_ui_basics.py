"""The browser UI's main loop, end to end: generate, edit, use, branch, export and import,
stop, and an API key, in a real headless chromium against the real server and model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    PHONE,
    PROMPT,
    card_text,
    cards,
    download,
    expect,
    expect_current,
    exported_tree,
    import_tree,
    library_row,
    model_id,
    new_story,
    saved,
    screenshot,
    set_settings,
    start_story,
    story_id,
    tree_node,
    wait_finished,
    wait_until,
    with_ignore_eos,
)
from tests.support.server import RunningServer, run_server

# The page, not the model, is under test here: it runs on the default model, the base
# model for continuing stories the page is made for; both models' answers to the same
# requests are tested through the API (test_completions.py, test_logprobs.py...).
pytestmark = pytest.mark.models(GEMMA)

MAX_TOKENS = 8
MILLISECONDS = re.compile(r"^\d+ ms$")


def test_generate_pick_branch_and_export(
    open_ui: Any, server: RunningServer, tmp_path: Path
) -> None:
    page = open_ui(server.base_url)
    expect(page.get_by_test_id("model-name")).to_have_text(model_id(server))

    # Generate n=3 from the prompt, with the keyboard shortcut.
    set_settings(page, n=3, max_tokens=MAX_TOKENS, seed=7)
    story = page.get_by_test_id("story")
    story.fill(PROMPT)
    story.press("Control+Enter")
    first = wait_finished(page, 3)
    expect(page.get_by_test_id("stats-ttft")).to_have_text(MILLISECONDS)
    expect_current(page, 1)

    # Edit the second continuation, then use it: it is appended and 3 new ones are generated.
    edited = first[1]["text"] + " The sea"
    card_text(page, 1).fill(edited)
    expect(cards(page).nth(1).get_by_test_id("edited")).to_be_visible()
    cards(page).nth(1).get_by_test_id("use").click()
    expect(story).to_have_value(PROMPT + edited)
    expect_current(page, 2)
    wait_finished(page, 3)

    # Back to the root: its continuations are still there; branch again from another one.
    tree_node(page, 1).click()
    expect(story).to_have_value(PROMPT)
    again = wait_finished(page, 3)
    assert [c["text"] for c in again] == [first[0]["text"], edited, first[2]["text"]]
    expect(cards(page).nth(1).get_by_test_id("branches")).to_have_text("branched 1×")
    cards(page).nth(0).get_by_test_id("use").click()
    expect_current(page, 3)
    expect(story).to_have_value(PROMPT + first[0]["text"])
    wait_finished(page, 3)
    expect(page.get_by_test_id("tree-node")).to_have_count(3)
    expect(tree_node(page, 1)).to_have_attribute("data-on-path", "true")
    expect(tree_node(page, 2)).to_have_attribute("data-on-path", "false")
    screenshot(page, "ui.png", tmp_path)

    tree = exported_tree(page)
    check_exported_tree(tree, edited, first[0]["text"])
    assert download(page, "export-text") == PROMPT + first[0]["text"]

    # Import it back with another current node, as a new story (the page asks first).
    tree["current"] = 2
    first_id = story_id(page)
    import_tree(page, tree)
    expect(page.get_by_role("dialog")).to_contain_text("It holds 3 node(s); this story has 3.")
    page.get_by_test_id("ask-new").click()
    expect_current(page, 2)
    expect(story).to_have_value(PROMPT + edited)
    expect(page.get_by_test_id("tree-node")).to_have_count(3)
    copy_id = story_id(page)
    page.get_by_test_id("to-library").click()
    expect(library_row(page, first_id)).to_be_visible()
    expect(library_row(page, copy_id)).to_be_visible()


def check_exported_tree(tree: dict[str, Any], edited: str, first_text: str) -> None:
    assert tree["format"] == "llama-srb-tree"
    assert tree["current"] == 3
    nodes = {node["id"]: node for node in tree["nodes"]}
    assert set(nodes) == {1, 2, 3}
    assert (nodes[1]["parent"], nodes[2]["parent"], nodes[3]["parent"]) == (None, 1, 1)
    assert (nodes[2]["via"], nodes[3]["via"]) == (1, 0)
    assert nodes[1]["text"] == PROMPT
    assert nodes[2]["text"] == PROMPT + edited
    assert nodes[3]["text"] == PROMPT + first_text
    assert nodes[1]["choices"][1]["text"] == edited
    assert nodes[1]["choices"][1]["edited"] is True
    for node in nodes.values():
        assert node["params"]["n"] == 3 and node["params"]["max_tokens"] == MAX_TOKENS
        assert len(node["choices"]) == 3
        assert all(c["finish_reason"] in ("stop", "length") for c in node["choices"])
        assert node["stats"]["completion_tokens"] > 0


def test_stop_cancels_on_server_on_a_phone_screen(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url, **PHONE)
    page.route("**/v1/completions", with_ignore_eos)
    set_settings(page, n=2, max_tokens=3000)
    page.get_by_test_id("story").fill("Count slowly from one to one thousand: one, two, three,")
    page.get_by_test_id("generate").click()

    # Both continuations visibly stream, then Stop cancels them.
    for i in range(2):
        expect(card_text(page, i)).not_to_have_value("")
    expect(page.get_by_test_id("finish-reason").first).to_have_text("streaming…")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("status")).to_have_text("Stopped.")
    expect(page.get_by_test_id("generate")).to_be_enabled()
    expect(page.get_by_test_id("finish-reason").first).to_have_text("stopped")
    wait_until(lambda: server.metric("llama_srb_sequences_running") == 0)

    # Phone-sized: the cards stack, nothing scrolls sideways, no keyboard hints.
    boxes = [cards(page).nth(i).bounding_box() for i in range(2)]
    assert boxes[0]["x"] == boxes[1]["x"] and boxes[1]["y"] > boxes[0]["y"]
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    expect(page.locator("kbd").first).to_be_hidden()


def test_api_key_is_asked_for_at_the_top_and_checked_as_typed(open_ui: Any, tmp_path: Path) -> None:
    with run_server(tmp_path, "--api-key", "sesame", "--n-ctx", "1024") as server:
        page = open_ui(server.base_url, library=True, **PHONE)
        label = page.get_by_test_id("model-name")
        key = page.get_by_test_id("api-key")
        expect(label).to_have_text("API key needed")
        expect(label).to_have_class("error")
        expect(key).to_be_focused()
        expect(key).to_be_in_viewport()
        expect(page.get_by_test_id("library-state")).to_contain_text("wants an API key")

        # Checked while typing, without leaving the field; the library is read with it.
        key.press_sequentially("wrong")
        expect(label).to_have_text("wrong API key")
        key.fill("sesame")
        expect(label).to_have_text(model_id(server, "sesame"))
        expect(label).not_to_have_class("error")
        expect(page.get_by_test_id("library-state")).to_be_hidden()
        new_story(page)
        expect(page.get_by_test_id("status")).to_have_text("")
        set_settings(page, n=2, max_tokens=3)
        page.get_by_test_id("story").fill(PROMPT)
        page.get_by_test_id("generate").click()
        wait_finished(page, 2)
        saved(page)
        page.evaluate("window.scrollTo(0, 0)")
        screenshot(page, "phone.png", tmp_path)


def test_every_branch_of_a_story_names_the_same_session(
    open_ui: Any, server: RunningServer
) -> None:
    """Behind deploy/nginx.conf the UI's X-Session-Id keeps a story on one replica: the
    same for every branch of a story, another for another story."""
    page = open_ui(server.base_url)
    sessions: list[str] = []
    page.on(
        "request",
        lambda r: r.url.endswith("/v1/completions") and sessions.append(r.headers["x-session-id"]),
    )
    start_story(page, n=2, max_tokens=4, seed=1)
    cards(page).nth(0).get_by_test_id("use").click()
    wait_finished(page, 2)
    page.get_by_test_id("new-story").click()
    start_story(page, "A different story begins here, far from the sea.", n=2, max_tokens=4)
    assert len(sessions) == 3 and sessions[0] == sessions[1] != sessions[2], sessions
    assert all(s.startswith("story-") for s in sessions)

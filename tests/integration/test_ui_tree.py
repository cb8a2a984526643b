"""The story tree as a writer uses it for an hour (issue 13): it stays readable on a long
path (defect 2), import asks first (defect 3), and branches can be read side by side,
bookmarked, pruned, deleted and walked with the keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    PROMPT,
    chain_tree,
    corners,
    current_id,
    expect,
    expect_current,
    exported_tree,
    import_tree,
    library_row,
    saved,
    screenshot,
    set_settings,
    story_id,
    tree_node,
    wait_finished,
)
from tests.support.server import RunningServer

# The page, not the model, is under test here: it runs on the default model, the base
# model for continuing stories the page is made for; both models' answers to the same
# requests are tested through the API (test_completions.py, test_logprobs.py...).
pytestmark = pytest.mark.models(GEMMA)

STEPS = [f" Step {i} of the long walk, and the sea kept rising." for i in range(1, 21)]


def label_box(page: Any, node_id: int) -> dict[str, float]:
    return tree_node(page, node_id).locator(".node-label").bounding_box()


def test_a_long_path_stays_one_readable_column_and_retries_are_siblings(
    open_ui: Any, server: RunningServer
) -> None:
    page = open_ui(server.base_url)
    import_tree(page, chain_tree(STEPS))  # 21 nodes, one "Use this" after another
    expect(page.get_by_test_id("tree-node")).to_have_count(21)
    expect_current(page, 21)

    # No indent without a fork: every label starts in the same column, wide and readable.
    lefts = {round(label_box(page, i)["x"]) for i in range(1, 22)}
    assert len(lefts) == 1, lefts
    assert min(label_box(page, i)["width"] for i in range(1, 22)) > 200
    tree = page.get_by_test_id("tree")
    assert tree.evaluate("t => t.scrollWidth <= t.clientWidth")
    expect(tree_node(page, 21)).to_be_in_viewport()

    # Two retries: siblings of the node retried (one fork, one level), not nested.
    set_settings(page, n=2, max_tokens=2, seed=8)
    page.get_by_test_id("retry").click()
    expect_current(page, 22)
    wait_finished(page, 2)
    page.get_by_test_id("tree-node").nth(0).focus()
    page.keyboard.press("Alt+r")
    expect_current(page, 23)
    wait_finished(page, 2)
    nodes = {n["id"]: n for n in exported_tree(page)["nodes"]}
    assert nodes[22]["parent"] == nodes[23]["parent"] == 20
    assert nodes[22]["retry_of"] == nodes[23]["retry_of"] == 21
    assert nodes[23]["text"] == nodes[21]["text"]
    retries = {round(label_box(page, i)["x"]) for i in (21, 22, 23)}
    assert len(retries) == 1 and retries.pop() > lefts.pop()
    expect(tree_node(page, 23)).to_have_attribute("data-kind", "retry")

    # The current node is kept in view: at the top of the tree and back at the bottom.
    tree_node(page, 1).click()
    expect(tree_node(page, 1)).to_be_in_viewport()
    page.keyboard.press("ArrowRight")  # back down the path last taken
    expect_current(page, 2)
    tree_node(page, 23).click()
    expect(tree_node(page, 23)).to_be_in_viewport()


def branching_tree() -> dict[str, Any]:
    """A root with three branches taken from it (its three cards), the middle one long and
    gone on two more steps."""
    added = [" Come home.", " She read it twice." + " The gulls circled and cried." * 12, " Burn."]
    params = {"n": 3, "max_tokens": 32, "temperature": 0.7, "seed": 11}
    choices = [{"text": t, "finish_reason": "stop", "tokens": 5} for t in added]
    nodes: list[dict[str, Any]] = [
        {"id": 1, "parent": None, "text": PROMPT, "choices": choices, "params": params}
    ]
    steps = [(1, 0, added[0]), (1, 1, added[1]), (1, 2, added[2])]
    steps += [(3, 0, ONWARDS[0]), (5, 1, ONWARDS[1])]
    for parent, via, more in steps:
        text = str(nodes[parent - 1]["text"]) + more
        node = {"id": len(nodes) + 1, "parent": parent, "via": via, "text": text}
        nodes.append({**node, "choices": choices, "params": params, "model_chars": len(more)})
    return {"format": "llama-srb-tree", "version": 2, "current": 1, "nodes": nodes}


ONWARDS = [" Then she walked down to the shore.", " The boat was waiting."]


def test_read_side_by_side_bookmark_prune_delete_and_walk_with_keys(
    open_ui: Any, server: RunningServer, tmp_path: Path
) -> None:
    page = open_ui(server.base_url)
    tree = branching_tree()
    import_tree(page, tree)
    expect_current(page, 1)

    # The branches taken from the node, side by side and in full; its settings are shown.
    branches = page.get_by_test_id("branch")
    expect(branches).to_have_count(3)
    tops = {y for _, y in corners(branches)}
    assert len(tops) == 1, tops
    long_text = tree["nodes"][2]["text"][len(PROMPT) :]
    expect(branches.nth(1).get_by_test_id("branch-text")).to_have_text(long_text)
    expect(branches.nth(1).get_by_test_id("branch-onwards")).to_have_text(
        "then, 2 step(s) on (#6):" + "".join(ONWARDS)
    )
    tree_node(page, 6).click()
    tree_node(page, 1).click()  # the middle branch now shows the path last taken
    screenshot(page, "tree.png", tmp_path, full_page=True)
    settings = page.get_by_test_id("node-settings")
    expect(settings).to_contain_text("temperature0.7")
    page.get_by_test_id("setting-temperature").fill("1.3")
    page.get_by_test_id("reuse-settings").click()
    expect(page.get_by_test_id("setting-temperature")).to_have_value("0.7")

    # Keys in the tree: → the child last visited (else the first), ↓ ↑ siblings, ← parent.
    tree_node(page, 1).focus()
    steps = [("ArrowRight", 3), ("ArrowRight", 5), ("ArrowLeft", 3), ("ArrowDown", 4)]
    steps += [("ArrowUp", 3), ("ArrowUp", 2), ("ArrowLeft", 1), ("ArrowRight", 2)]
    for key, expected in [*steps, ("ArrowDown", 3)]:
        page.keyboard.press(key)
        expect_current(page, expected)
    assert page.evaluate("document.activeElement.dataset.nodeId") == "3"

    # Bookmark #3 (key b), prune beside #2: #4 goes, the bookmarked #3 stays.
    page.keyboard.press("b")
    expect(page.get_by_test_id("bookmark")).to_have_attribute("aria-pressed", "true")
    expect(tree_node(page, 3).locator(".node-star")).to_be_visible()
    tree_node(page, 2).click()
    page.get_by_test_id("prune").click()
    expect(page.get_by_test_id("notice")).to_contain_text("Pruned 1 node(s)")
    expect(page.get_by_test_id("tree-node")).to_have_count(5)

    # Delete #3; export: it is gone. Undo brings it back, Redo takes it again.
    tree_node(page, 3).click()
    page.get_by_test_id("delete-node").click()
    expect_current(page, 1)
    assert {n["id"] for n in exported_tree(page)["nodes"]} == {1, 2}
    page.get_by_test_id("undo").click()
    expect(tree_node(page, 3)).to_be_visible()
    expect_current(page, 3)
    page.get_by_test_id("redo").click()
    expect(tree_node(page, 3)).to_have_count(0)
    assert current_id(page) == 1


def test_import_asks_before_adding_to_the_story(open_ui: Any, server: RunningServer) -> None:
    page = open_ui(server.base_url)
    import_tree(page, chain_tree(STEPS[:2]))  # an empty story: nothing to ask about
    expect(page.get_by_test_id("tree-node")).to_have_count(3)

    dialog = page.get_by_role("dialog")
    import_tree(page, branching_tree(), name="other.json")
    expect(dialog).to_contain_text("Import other.json?")
    page.get_by_test_id("ask-cancel").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(3)
    expect_current(page, 3)

    # Added beside: both are in the story, the imported one shown; Undo takes it back.
    import_tree(page, branching_tree(), name="other.json")
    page.get_by_test_id("ask-add").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(9)
    expect_current(page, 4)
    expect(page.get_by_test_id("story")).to_have_value(PROMPT)
    tree_node(page, 4).focus()  # outside the story box, whose Ctrl+Z is its own
    page.keyboard.press("Control+z")
    expect(page.get_by_test_id("tree-node")).to_have_count(3)
    # The library lists what the server holds: the undo's save lands first (leaving a
    # story saves what is left, but the list may be read before that save is done).
    saved(page)

    # As a new story: this one stays as it was, the library has both.
    first_id = story_id(page)
    import_tree(page, branching_tree(), name="other.json")
    page.get_by_test_id("ask-new").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(6)
    expect(page.get_by_test_id("story-name")).to_have_value("other")
    page.get_by_test_id("to-library").click()
    expect(library_row(page, first_id)).to_contain_text("3 nodes")
    expect(page.get_by_test_id("library-story").filter(has_text="other")).to_contain_text("6 nodes")

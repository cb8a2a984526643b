"""The story library as a writer uses it (issue 30): stories live on the server, each with
its own tree, memory, note and settings; two tabs and two devices write to one story and
nothing is lost (a real clash is asked about); a server killed with SIGKILL mid-edit loses
nothing that was saved, and what was typed meanwhile is saved when it is back; the old
browser-only tree moves into the library once; undo survives a reload; a long prompt shows
how far it is read; a 1,000-node story folds, searches and walks with the keys; and the
page runs under a strict Content-Security-Policy."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import (
    GENERATION_TIMEOUT_MS,
    PROMPT,
    card_text,
    cards,
    chain_tree,
    expect,
    expect_current,
    import_tree,
    library_row,
    new_story,
    saved,
    screenshot,
    set_settings,
    start_story,
    story_id,
    tree_node,
    wait_finished,
)
from tests.support.server import RunningServer, free_port, run_server

# The page, not the model, is under test here: the default model (a base model, for
# continuing stories).
pytestmark = pytest.mark.models(GEMMA)

SERVER_ARGS = ("--n-ctx", "8192")


@pytest.fixture(scope="module")
def library_server(
    tmp_path_factory: pytest.TempPathFactory, bundled_model: str
) -> Iterator[RunningServer]:
    """A server (and a library) of this module's own: its lists hold only these stories."""
    with run_server(
        tmp_path_factory.mktemp("library"), "--model", bundled_model, *SERVER_ARGS
    ) as s:
        yield s


def stored(server: RunningServer, sid: str) -> dict[str, Any]:
    response = httpx.get(f"{server.api_url}/stories/{sid}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def texts(server: RunningServer, sid: str) -> list[str]:
    return sorted(n["text"] for n in stored(server, sid)["nodes"])


def open_in(page: Any, sid: str) -> None:
    """From the library, the story `sid`."""
    library_row(page, sid).get_by_test_id("open-story").click()
    expect(page.get_by_test_id("story")).to_be_visible()


def test_the_library_opens_first_and_keeps_each_story_its_own(
    open_ui: Any, library_server: RunningServer, tmp_path: Path
) -> None:
    page = open_ui(library_server.base_url, library=True)
    expect(page.get_by_test_id("library")).to_be_visible()
    new_story(page)
    page.get_by_test_id("story-name").fill("The Letter")
    page.locator("#context-panel summary").click()
    page.get_by_test_id("memory").fill("Maine, 1890. A lighthouse.")
    start_story(page, n=2, max_tokens=4, seed=1)
    saved(page)
    letter = story_id(page)

    # A new story starts empty: its own tree, no memory, the default settings.
    page.get_by_test_id("new-story").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(0)
    expect(page.get_by_test_id("memory")).to_have_value("")
    expect(page.get_by_test_id("setting-n")).to_have_value("4")
    start_story(page, "A storm came over the hills before dawn.", n=3, max_tokens=4, seed=2)
    saved(page)
    storm = story_id(page)

    # The library: each story with its name, length and when it was opened, the last first.
    page.get_by_test_id("library-link").click()
    rows = page.get_by_test_id("library-story")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_have_attribute("data-story-id", storm)
    expect(library_row(page, letter)).to_contain_text("The Letter")
    expect(library_row(page, letter)).to_contain_text("11 words · 1 nodes · opened just now")
    expect(library_row(page, storm)).to_contain_text("A storm came over the hills…")

    # Rename, duplicate, delete (Undo brings it back), find by name.
    library_row(page, storm).get_by_test_id("rename-story").click()
    page.get_by_test_id("rename-input").fill("Storm")
    page.get_by_test_id("rename-input").press("Enter")
    expect(library_row(page, storm).get_by_test_id("library-name")).to_have_text("Storm")
    library_row(page, letter).get_by_test_id("duplicate-story").click()
    expect(rows).to_have_count(3)
    expect(page.get_by_test_id("library-state")).to_contain_text("is a copy of “The Letter”")
    library_row(page, storm).get_by_test_id("delete-story").click()
    expect(rows).to_have_count(2)
    page.get_by_test_id("library-undo").click()
    expect(rows).to_have_count(3)
    page.get_by_test_id("library-search").fill("letter")
    expect(rows).to_have_count(2)
    expect(page.get_by_test_id("library-count")).to_have_text("2 of 3 stories")
    page.get_by_test_id("library-search").fill("")
    page.get_by_test_id("library-search").blur()
    screenshot(page, "library.png", tmp_path)
    assert stored(library_server, storm)["name"] == "Storm"

    # Opened again, a story has its own memory and settings back.
    open_in(page, letter)
    expect(page.get_by_test_id("memory")).to_have_value("Maine, 1890. A lighthouse.")
    expect(page.get_by_test_id("setting-n")).to_have_value("2")
    expect(page.get_by_test_id("story-name")).to_have_value("The Letter")
    expect(page.get_by_test_id("tree-node")).to_have_count(1)

    # Another device (a fresh browser) sees the same library and opens the same story.
    other = open_ui(library_server.base_url, library=True)
    expect(library_row(other, letter)).to_contain_text("The Letter")
    open_in(other, letter)
    expect(other.get_by_test_id("memory")).to_have_value("Maine, 1890. A lighthouse.")
    expect(card_text(other, 1)).to_have_value(card_text(page, 1).input_value())


def test_two_tabs_on_one_story_both_writing_lose_nothing(
    open_ui: Any, library_server: RunningServer
) -> None:
    """Issue 30, defect 1: the last tab to write won, silently. Now both tabs' nodes are
    kept (the server gives one of them a new id) and each tab shows the other's."""
    a = open_ui(library_server.base_url)
    first = start_story(a, n=2, max_tokens=4, seed=5)
    saved(a)
    sid = story_id(a)
    b = open_ui(library_server.base_url, library=True, context=a.context)  # a second tab
    open_in(b, sid)
    expect(b.get_by_test_id("tree-node")).to_have_count(1)

    cards(a).nth(0).get_by_test_id("use").click()
    cards(b).nth(1).get_by_test_id("use").click()
    wait_finished(a, 2)
    wait_finished(b, 2)
    for page in (a, b):
        expect(page.get_by_test_id("tree-node")).to_have_count(3)
        saved(page)
    assert texts(library_server, sid) == sorted(
        [PROMPT, PROMPT + first[0]["text"], PROMPT + first[1]["text"]]
    )
    # The same tree in both, ids and all.
    ids = lambda page: sorted(  # noqa: E731
        int(x)
        for x in page.get_by_test_id("tree-node").evaluate_all(
            "nodes => nodes.map(n => n.dataset.nodeId)"
        )
    )
    assert ids(a) == ids(b) == [1, 2, 3]


def test_a_real_clash_between_two_devices_is_asked_and_both_are_kept(
    open_ui: Any, library_server: RunningServer
) -> None:
    a = open_ui(library_server.base_url)
    start_story(a, n=2, max_tokens=4, seed=6)
    saved(a)
    sid = story_id(a)
    b = open_ui(library_server.base_url, library=True)  # another device
    open_in(b, sid)
    expect(card_text(b, 0)).to_have_value(card_text(a, 0).input_value())

    # B loses its connection and edits the first card; A edits the same card meanwhile.
    b.context.set_offline(True)
    card_text(b, 0).fill(" B's ending, written on the train.")
    expect(b.get_by_test_id("save-state")).to_contain_text("cannot be reached")
    card_text(a, 0).fill(" A's ending, written at home.")
    saved(a)
    b.context.set_offline(False)
    dialog = b.get_by_role("dialog")
    # The page retries at most 15 s apart (sync.js), sooner when it is online again.
    expect(dialog).to_contain_text(
        "This story changed elsewhere too", timeout=GENERATION_TIMEOUT_MS
    )
    expect(dialog).to_contain_text("#1: its continuations")
    b.get_by_test_id("ask-both").click()
    saved(b)
    # Both endings are in the story: A's in its node, B's in a copy beside it.
    nodes = stored(library_server, sid)["nodes"]
    firsts = sorted(n["choices"][0]["text"] for n in nodes)
    assert firsts == [" A's ending, written at home.", " B's ending, written on the train."]
    expect(b.get_by_test_id("tree-node")).to_have_count(2)


# Longer than the prefix cache's shortest reusable prefix (32 tokens).
STORY = PROMPT + " The sea was grey, and the wind came from the north, cold and steady." * 4


def test_a_server_killed_mid_edit_loses_nothing_it_saved(open_ui: Any, tmp_path: Path) -> None:
    """SIGKILL while the writer types: what was saved before is there after a restart, and
    what was typed while the server was down is saved once it is back. The story opened
    again is read into the new server's empty prefix cache."""
    port = free_port()
    args = ("--data-dir", str(tmp_path / "data"), *SERVER_ARGS)
    with run_server(tmp_path, *args, port=port) as first:
        page = open_ui(first.base_url)
        start_story(page, STORY, n=2, max_tokens=4, seed=7)
        cards(page).nth(0).get_by_test_id("use").click()
        wait_finished(page, 2)
        saved(page)
        sid = story_id(page)
        confirmed = texts(first, sid)
        page.locator("#context-panel summary").click()
        page.get_by_test_id("memory").fill("Typed as the server died.")
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait()
        page.get_by_test_id("bookmark").click()
        expect(page.get_by_test_id("save-state")).to_contain_text("cannot be reached")
    with run_server(tmp_path, *args, port=port) as second:
        saved_again = page.get_by_test_id("save-state")
        expect(saved_again).to_have_text(re.compile(r"^Saved"), timeout=60_000)
        story = stored(second, sid)
        assert sorted(n["text"] for n in story["nodes"]) == confirmed
        assert story["context"]["memory"] == "Typed as the server died."
        assert [n["bookmarked"] for n in story["nodes"] if n["id"] == 2] == [True]

        # Opened again, the story is read into the (empty) prefix cache at once.
        page.reload()
        expect(page.get_by_test_id("reading-text")).to_have_text(
            "Read: the story is in the model's cache, continuations start at once.",
            timeout=60_000,
        )
        before = cached_tokens(second)
        page.get_by_test_id("generate").click()
        wait_finished(page, 2)
        prompt = next(n["text"] for n in story["nodes"] if n["id"] == 2)
        count = httpx.post(f"{second.api_url}/tokenize", json={"prompt": prompt}, timeout=30)
        assert cached_tokens(second) - before >= count.json()["count"] - 1


def cached_tokens(server: RunningServer) -> float:
    return server.metric("llama_srb_prompt_tokens_cached_total")


def test_an_old_browser_tree_moves_into_the_library_once(
    open_ui: Any, library_server: RunningServer
) -> None:
    """Issue 30: the tree used to live in one localStorage key, every story a root of it.
    On the first visit after the upgrade each story becomes one of the library, with the
    settings and the draft the old page kept; a second visit moves nothing twice."""
    old = chain_tree([" It said: come home.", " She went."])
    old["nodes"].append(
        {"id": 4, "parent": None, "text": "A second story, about a fox.", "choices": []}
    )
    old["nodes"].append(
        {"id": 5, "parent": None, "text": PROMPT, "retry_of": 1, "choices": [], "via": None}
    )
    old["current"] = 3
    draft = {"node": 3, "text": old["nodes"][2]["text"] + " Unsaved words."}
    page = open_ui(library_server.base_url, library=True)
    page.evaluate(
        """([tree, draft]) => {
            localStorage.setItem("llama-srb.tree", JSON.stringify(tree));
            localStorage.setItem("llama-srb.draft", JSON.stringify(draft));
            localStorage.setItem("llama-srb.settings", JSON.stringify({n: "3", max_tokens: "9"}));
        }""",
        [old, draft],
    )
    expect(page.get_by_test_id("library-count")).to_have_text(re.compile(r"stor"))  # read
    before = page.get_by_test_id("library-story").count()
    page.reload()
    expect(page.get_by_test_id("library-state")).to_contain_text("are in the library now")
    rows = page.get_by_test_id("library-story")
    expect(rows).to_have_count(before + 2)
    moved = page.locator('[data-testid="library-story"][data-story-id^="legacy-"]')
    lighthouse = moved.filter(has_text="The lighthouse keeper found")
    expect(lighthouse).to_contain_text("4 nodes")  # the story, and the retry of its start
    expect(moved.filter(has_text="A second story, about a fox.")).to_contain_text("1 nodes")
    assert page.evaluate("localStorage.getItem('llama-srb.tree')") is None

    lighthouse.get_by_test_id("open-story").click()
    expect_current(page, 3)
    expect(page.get_by_test_id("story")).to_have_value(draft["text"])
    expect(page.get_by_test_id("setting-n")).to_have_value("3")
    page.reload()
    page.get_by_test_id("library-link").click()
    expect(rows).to_have_count(before + 2)


# A slow disk under the browser: each write of IndexedDB stays uncommitted for 600 ms
# (the transaction is kept busy), so a write still on its way when the page goes is lost.
SLOW_BROWSER_STORE = """(() => {
  const put = IDBObjectStore.prototype.put;
  IDBObjectStore.prototype.put = function (...args) {
    const request = put.apply(this, args);
    const until = Date.now() + 600;
    const busy = () => {
      if (Date.now() < until) this.count().onsuccess = busy;
    };
    busy();
    return request;
  };
})()"""


def test_undo_survives_a_reload(open_ui: Any, library_server: RunningServer) -> None:
    """Right after "Saved", undo's history is in the browser too: a reload finds it, even
    when the browser's store writes slowly (before, "Saved" came with the write still on
    its way, and a reload under load lost the history now and then)."""
    page = open_ui(library_server.base_url)
    page.evaluate(SLOW_BROWSER_STORE)
    page.add_init_script(SLOW_BROWSER_STORE)
    start_story(page, n=2, max_tokens=4, seed=8)
    cards(page).nth(1).get_by_test_id("use").click()
    wait_finished(page, 2)
    page.get_by_test_id("delete-node").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    saved(page)
    page.reload()
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    expect(page.get_by_test_id("undo")).to_be_enabled()
    page.get_by_test_id("undo").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(2)
    expect_current(page, 2)
    page.get_by_test_id("undo").click()  # and the generation before it
    expect(page.get_by_test_id("tree-node")).to_have_count(1)
    page.get_by_test_id("redo").click()
    expect(page.get_by_test_id("tree-node")).to_have_count(2)
    saved(page)
    assert len(stored(library_server, story_id(page))["nodes"]) == 2


LONG = " ".join(
    f"Night {i}: the keeper climbed the stairs, trimmed the wick and watched the sea."
    for i in range(220)
)


def test_a_long_prompt_shows_how_far_it_is_read(
    open_ui: Any, library_server: RunningServer, tmp_path: Path
) -> None:
    """Issue 30, defect 5: a 3,000-word paste showed nothing for 48 s. Now the page says
    how many of its tokens are read, with an estimate; the story's length and its share of
    the context are shown; the continuations stay in view."""
    page = open_ui(library_server.base_url)
    story = page.get_by_test_id("story")
    story.fill(LONG)
    expect(page.get_by_test_id("word-count")).to_have_text(f"{len(LONG.split()):,} words")
    expect(page.get_by_test_id("context-text")).to_contain_text(re.compile(r"of 8,192 tokens"))
    set_settings(page, n=4, max_tokens=8, seed=9)
    page.get_by_test_id("generate").click()
    reading = page.get_by_test_id("reading-text")
    # Reading 4,000-odd tokens takes tens of seconds here, minutes on a busy machine.
    expect(reading).to_contain_text(
        re.compile(r"Reading the story: [\d,]+ of [\d,]+ tokens"), timeout=300_000
    )
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "progress.png", tmp_path)
    wait_finished(page, 4, timeout=600_000)
    expect(page.get_by_test_id("reading")).to_be_hidden()
    # The story box does not push the cards away: the first one is on screen.
    top = cards(page).nth(0).bounding_box()["y"]
    assert top < page.viewport_size["height"] - 100, top


def big_tree(count: int = 1000) -> dict[str, Any]:
    """A story that forked three ways at every node, breadth first: ~7 levels, one node
    (the last) says "lantern"."""
    words = ["north", "south", "home"]
    nodes: list[dict[str, Any]] = [{"id": 1, "parent": None, "text": PROMPT, "choices": []}]
    queue = [nodes[0]]
    while len(nodes) < count:
        parent = queue.pop(0)
        for via, word in enumerate(words):
            if len(nodes) == count:
                break
            node_id = len(nodes) + 1
            added = f" Then #{node_id} went {word}." if node_id < count else " A lantern glowed."
            node = {
                "id": node_id,
                "parent": parent["id"],
                "via": via,
                "text": parent["text"] + added,
            }
            node["choices"] = [
                {"text": f" and {w}", "finish_reason": "stop", "tokens": 2} for w in words
            ]
            node["model_chars"] = len(added)
            nodes.append(node)
            queue.append(node)
    return {"format": "llama-srb-tree", "version": 2, "current": 40, "nodes": nodes}


def test_a_1000_node_story_folds_searches_and_walks_with_the_keys(
    open_ui: Any, library_server: RunningServer, tmp_path: Path
) -> None:
    page = open_ui(library_server.base_url)
    import_tree(page, big_tree(), name="Forking paths.json")
    rows = page.get_by_test_id("tree-node")
    expect(rows).to_have_count(1000)
    expect_current(page, 40)
    saved(page)
    assert len(stored(library_server, story_id(page))["nodes"]) == 1000

    # Siblings' labels start where they differ; a fold shows what it hides.
    expect(tree_node(page, 2).locator(".node-label")).to_have_text("Then #2 went north.")
    page.get_by_test_id("tree-fold").click()
    shown = rows.count()
    assert shown < 40, shown
    expect(tree_node(page, 2).get_by_test_id("folded")).to_have_text(re.compile(r"^\+\d+$"))
    expect_current(page, 40)

    # One Tab stop: from the fold button, Tab lands on the current node, the next leaves.
    page.get_by_test_id("tree-fold").focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.nodeId") == "40"
    page.keyboard.press("ArrowLeft")
    expect_current(page, 13)
    page.keyboard.press("ArrowUp")
    expect_current(page, 12)
    folded = tree_node(page, 12).get_by_test_id("folded")
    expect(folded).to_have_text("+108")  # folded by "Fold others"
    page.keyboard.press("c")  # unfolds what grew from #12
    expect(folded).to_have_count(0)
    expect(tree_node(page, 35)).to_be_visible()
    page.keyboard.press("c")
    expect(folded).to_have_text("+108")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.closest('#tree')") is None

    # Find: only the match and the way to it stay; Enter goes there.
    page.get_by_test_id("tree-search").fill("lantern")
    expect(page.get_by_test_id("tree-found")).to_have_text("1 found")
    expect(rows).to_have_count(7)
    page.get_by_test_id("tree-search").press("Enter")
    expect_current(page, 1000)
    expect(page.get_by_test_id("story")).to_have_value(re.compile(r"A lantern glowed\.$"))
    page.get_by_test_id("tree-search").fill("")
    expect(page.get_by_test_id("tree-found")).to_have_text("")
    expect(tree_node(page, 1000)).to_be_in_viewport()  # the way to it unfolded
    assert shown < rows.count() < 60
    saved(page)
    screenshot(page, "tree-large.png", tmp_path)


CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def test_the_page_runs_under_a_strict_content_security_policy(
    open_ui: Any, library_server: RunningServer
) -> None:
    """No inline script or style, no eval: the page works with a CSP that allows only its
    own files (the headers another change adds to the server, sent here by the test)."""
    page = open_ui(library_server.base_url, library=True)
    violations: list[str] = []
    page.on(
        "console",
        lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None,
    )

    def with_csp(route: Any) -> None:
        response = route.fetch()
        headers = {**response.headers, "content-security-policy": CSP}
        route.fulfill(response=response, headers=headers)

    page.route(f"{library_server.base_url}/", with_csp)
    page.reload()
    assert "default-src 'self'" in page.evaluate(
        "fetch(location.href).then(r => r.headers.get('content-security-policy'))"
    )
    new_story(page)
    start_story(page, n=2, max_tokens=4, seed=10)
    page.get_by_test_id("library-link").click()
    expect(page.get_by_test_id("library-story").first).to_be_visible()
    assert violations == [], violations

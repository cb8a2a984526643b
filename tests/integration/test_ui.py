"""End to end: the browser UI (llama_srb/web) in a real headless Chromium, real server, real model.

Uses Debian's chromium driven by Playwright for Python; no browser is ever downloaded.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llama_srb.testing import RunningServer, run_server

CHROMIUM = Path("/usr/bin/chromium")
# `make screenshot` sets this to docs/ui.png; `make test` leaves tracked files alone.
SCREENSHOT = os.environ.get("LLAMA_SRB_SCREENSHOT")
PROMPT = "The lighthouse keeper found a letter on the rocks. It said:"
GENERATION_TIMEOUT_MS = 30_000
MAX_TOKENS = 16
MILLISECONDS = re.compile(r"^\d+ ms$")

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (make test)"
)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs the playwright Python package (make test installs it)"
)
expect = sync_api.expect


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def open_ui(browser: Any) -> Iterator[Callable[..., Any]]:
    """Opens the UI in a fresh browser context (empty local storage); at the end, closes it
    and fails on any uncaught script error the page raised."""
    contexts: list[Any] = []
    errors: list[str] = []

    def open_page(url: str, width: int = 1280, height: int = 900) -> Any:
        context = browser.new_context(
            viewport={"width": width, "height": height}, accept_downloads=True
        )
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.set_default_timeout(10_000)
        page.goto(url + "/")
        return page

    yield open_page
    for context in contexts:
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def model_id(server: RunningServer, api_key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    models = httpx.get(f"{server.api_url}/models", headers=headers, timeout=10).json()
    return str(models["data"][0]["id"])


def set_settings(page: Any, **values: object) -> None:
    for key, value in values.items():
        page.get_by_test_id(f"setting-{key}").fill(str(value))


def cards(page: Any) -> Any:
    return page.get_by_test_id("continuation")


def wait_finished(page: Any, n: int) -> list[dict[str, str]]:
    """Waits for `n` finished continuation cards; returns their text, reason and count."""
    finished = page.locator('[data-testid="continuation"][data-finished="true"]')
    expect(finished).to_have_count(n, timeout=GENERATION_TIMEOUT_MS)
    expect(cards(page)).to_have_count(n)
    expect(page.get_by_test_id("generate")).to_be_enabled()
    result = []
    for i in range(n):
        card = cards(page).nth(i)
        result.append(
            {
                "text": card.get_by_test_id("continuation-text").input_value(),
                "reason": card.get_by_test_id("finish-reason").inner_text(),
                "tokens": card.get_by_test_id("token-count").inner_text(),
            }
        )
    for choice in result:
        assert choice["reason"] in ("stop", "length"), choice
        assert choice["tokens"].endswith(" tok"), choice
    return result


def tree_node(page: Any, node_id: int) -> Any:
    return page.locator(f'[data-testid="tree-node"][data-node-id="{node_id}"]')


def expect_current(page: Any, node_id: int) -> None:
    expect(tree_node(page, node_id)).to_have_attribute("aria-current", "true")


def download(page: Any, testid: str) -> str:
    with page.expect_download() as info:
        page.get_by_test_id(testid).click()
    return Path(info.value.path()).read_text(encoding="utf-8")


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
    cards(page).nth(1).get_by_test_id("continuation-text").fill(edited)
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

    page.mouse.move(0, 0)  # no hover highlight in the picture
    page.screenshot(path=SCREENSHOT or str(tmp_path / "ui.png"))

    tree = json.loads(download(page, "export-json"))
    check_exported_tree(tree, edited, first[0]["text"])
    assert download(page, "export-text") == PROMPT + first[0]["text"]

    # Import it back with another current node: the UI shows that node's story.
    tree["current"] = 2
    page.get_by_test_id("import-file").set_input_files(
        files=[
            {"name": "t.json", "mimeType": "application/json", "buffer": json.dumps(tree).encode()}
        ]
    )
    expect_current(page, 2)
    expect(story).to_have_value(PROMPT + edited)
    expect(page.get_by_test_id("tree-node")).to_have_count(3)


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
    page = open_ui(server.base_url, width=390, height=844)
    # The UI has no ignore_eos control; add it so neither continuation can end by itself.
    page.route("**/v1/completions", with_ignore_eos)
    set_settings(page, n=2, max_tokens=3000)
    page.get_by_test_id("story").fill("Count slowly from one to one thousand: one, two, three,")
    page.get_by_test_id("generate").click()

    # Both continuations visibly stream, then Stop cancels them.
    for i in range(2):
        expect(cards(page).nth(i).get_by_test_id("continuation-text")).not_to_have_value("")
    expect(page.get_by_test_id("finish-reason").first).to_have_text("streaming…")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("status")).to_have_text("Stopped.")
    expect(page.get_by_test_id("generate")).to_be_enabled()
    assert "stopped" in page.get_by_test_id("finish-reason").all_inner_texts()
    wait_until(lambda: server.metric("llama_srb_sequences_running") == 0)

    # Phone-sized: the cards stack and nothing scrolls sideways.
    boxes = [cards(page).nth(i).bounding_box() for i in range(2)]
    assert boxes[0]["x"] == boxes[1]["x"] and boxes[1]["y"] > boxes[0]["y"]
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def with_ignore_eos(route: Any) -> None:
    route.continue_(post_data=json.dumps({**route.request.post_data_json, "ignore_eos": True}))


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_api_key_is_sent(open_ui: Any, tmp_path: Path) -> None:
    with run_server(tmp_path, "--api-key", "sesame", "--n-ctx", "1024") as server:
        page = open_ui(server.base_url)
        expect(page.get_by_test_id("model-name")).to_have_class("error")
        page.get_by_test_id("api-key").fill("sesame")
        page.get_by_test_id("api-key").press("Tab")  # `change` fires on leaving the field
        expect(page.get_by_test_id("model-name")).to_have_text(model_id(server, "sesame"))
        set_settings(page, n=2, max_tokens=4)
        page.get_by_test_id("story").fill(PROMPT)
        page.get_by_test_id("generate").click()
        wait_finished(page, 2)

"""Shared pieces of the browser UI tests (test_ui_*.py): Debian's chromium driven by
Playwright against the real server, as a writer would use the page. No browser is ever
downloaded; without chromium or Playwright the UI tests skip.
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

from tests.support.server import RunningServer

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the `browser` fixture skips
    expect = sync_playwright = None  # type: ignore[assignment]

CHROMIUM = Path("/usr/bin/chromium")
# `make screenshot` sets this to docs/; `make test` leaves tracked files alone.
SCREENSHOT_DIR = os.environ.get("LLAMA_SRB_SCREENSHOT")
PROMPT = "The lighthouse keeper found a letter on the rocks. It said:"
# An upper bound, not a timing: generous, since a busy machine (both cores taken by other
# work) makes a step several times slower.
GENERATION_TIMEOUT_MS = 120_000
PHONE = {"width": 390, "height": 844}
# Every CSP violation as a console message (chromium also logs its own "Refused to ...").
CSP_REPORTER = """document.addEventListener("securitypolicyviolation", (e) =>
  console.error(`Content Security Policy violation: ${e.violatedDirective} ${e.blockedURI}`));"""


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if sync_playwright is None:
        pytest.skip("needs the playwright Python package (make test installs it)")
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (make test)")
    # A loaded machine can take seconds for a first token; assertions wait that long.
    expect.set_options(timeout=30_000)
    with sync_playwright() as playwright:
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
    and fails on any uncaught script error, failed request (a 404) or breach of the
    server's Content-Security-Policy the page had."""
    contexts: list[Any] = []
    errors: list[str] = []

    def open_page(
        url: str, width: int = 1280, height: int = 900, library: bool = False, context: Any = None
    ) -> Any:
        """A page on the UI; it opens on the library, and (unless `library`) a new story
        is started from there, as a writer starts one. `context`: open it in that browser
        context (another tab of the same profile) instead of a fresh one."""
        if context is None:
            context = browser.new_context(
                viewport={"width": width, "height": height}, accept_downloads=True
            )
            context.add_init_script(CSP_REPORTER)
            contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on(
            "console",
            lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None,
        )
        page.on(
            "response",
            lambda r: errors.append(f"{r.status} {r.url}") if r.status == 404 else None,
        )
        page.set_default_timeout(30_000)
        page.goto(url + "/")
        if not library:
            new_story(page)
        return page

    yield open_page
    for context in contexts:
        context.close()
    assert errors == [], f"errors in the page: {errors}"


def new_story(page: Any) -> None:
    """From the library: a new, empty story, open."""
    page.get_by_test_id("library-new").click()
    expect(page.get_by_test_id("story")).to_be_visible()


def story_id(page: Any) -> str:
    """The open story's id, from the page's address (#story=<id>)."""
    return str(page.evaluate("new URLSearchParams(location.hash.slice(1)).get('story')"))


def library_row(page: Any, sid: str) -> Any:
    return page.locator(f'[data-testid="library-story"][data-story-id="{sid}"]')


def saved(page: Any) -> None:
    """Waits until the page says the story is saved on the server (its last change too)."""
    expect(page.get_by_test_id("save-state")).to_have_text(re.compile(r"^Saved"))


def model_id(server: RunningServer, api_key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    models = httpx.get(f"{server.api_url}/models", headers=headers, timeout=10).json()
    return str(models["data"][0]["id"])


def set_settings(page: Any, **values: object) -> None:
    for key, value in values.items():
        page.get_by_test_id(f"setting-{key}").fill(str(value))


def cards(page: Any) -> Any:
    return page.get_by_test_id("continuation")


def corners(locator: Any) -> list[tuple[int, int]]:
    """Each element's top-left corner (x, y), all read in one frame: reads in turn can
    straddle a shift of the page above them (a status line appearing)."""
    js = "els => els.map(e => e.getBoundingClientRect()).map(r => [r.x, r.y].map(Math.round))"
    return [(x, y) for x, y in locator.evaluate_all(js)]


def card_text(page: Any, i: int) -> Any:
    return cards(page).nth(i).get_by_test_id("continuation-text")


def wait_finished(page: Any, n: int, timeout: int = GENERATION_TIMEOUT_MS) -> list[dict[str, str]]:
    """Waits for `n` finished continuation cards; returns their text, reason and count."""
    finished = page.locator('[data-testid="continuation"][data-finished="true"]')
    expect(finished).to_have_count(n, timeout=timeout)
    expect(cards(page)).to_have_count(n)
    expect(page.get_by_test_id("generate")).to_be_enabled(timeout=GENERATION_TIMEOUT_MS)
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


def start_story(page: Any, text: str = PROMPT, **settings: object) -> list[dict[str, str]]:
    """Types a story start with these settings, generates, and waits for the cards."""
    set_settings(page, **settings)
    page.get_by_test_id("story").fill(text)
    page.get_by_test_id("generate").click()
    return wait_finished(page, int(str(settings.get("n", 4))))


def tree_node(page: Any, node_id: int) -> Any:
    return page.locator(f'[data-testid="tree-node"][data-node-id="{node_id}"]')


def expect_current(page: Any, node_id: int) -> None:
    expect(tree_node(page, node_id)).to_have_attribute("aria-current", "true")


def current_id(page: Any) -> int:
    return int(
        page.locator('[data-testid="tree-node"][aria-current="true"]').get_attribute("data-node-id")
    )


def download(page: Any, testid: str) -> str:
    with page.expect_download() as info:
        page.get_by_test_id(testid).click()
    return Path(info.value.path()).read_text(encoding="utf-8")


def exported_tree(page: Any) -> dict[str, Any]:
    return json.loads(download(page, "export-json"))


def import_tree(page: Any, tree: dict[str, Any], name: str = "t.json") -> None:
    page.get_by_test_id("import-file").set_input_files(
        files=[{"name": name, "mimeType": "application/json", "buffer": json.dumps(tree).encode()}]
    )


def chain_tree(texts: list[str], story: str = PROMPT) -> dict[str, Any]:
    """An exported tree of one straight path: each node continues the one before with the
    next text (as a run of "Use this" makes), every node with two finished cards."""
    nodes = []
    text = story
    for i, added in enumerate(["", *texts]):
        text += added
        choices = [
            {"text": texts[i] if i < len(texts) else " and so on.", "finish_reason": "stop"},
            {"text": " something else.", "finish_reason": "stop"},
        ]
        nodes.append(
            {
                "id": i + 1,
                "parent": i or None,
                "via": 0 if i else None,
                "text": text,
                "choices": [{**c, "tokens": 3} for c in choices],
            }
        )
    return {"format": "llama-srb-tree", "version": 2, "current": len(nodes), "nodes": nodes}


def screenshot(
    page: Any, name: str, tmp_path: Path, keep_hover: bool = False, full_page: bool = False
) -> None:
    """A picture for the README under `make screenshot`, else a throwaway one."""
    if not keep_hover:
        page.mouse.move(0, 0)
    target = Path(SCREENSHOT_DIR) / name if SCREENSHOT_DIR else tmp_path / name
    page.screenshot(path=str(target), full_page=full_page)


def in_viewport(page: Any, locator: Any) -> bool:
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    return box is not None and box["y"] >= -1 and box["y"] < height


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def with_ignore_eos(route: Any) -> None:
    """Adds ignore_eos (no UI control has it) so a continuation cannot end by itself."""
    route.continue_(post_data=json.dumps({**route.request.post_data_json, "ignore_eos": True}))


def sent_prompts(page: Any) -> list[str]:
    """Records the prompt of every completion request the page sends from now on."""
    prompts: list[str] = []

    def on_request(request: Any) -> None:
        if request.url.endswith("/v1/completions") and request.method == "POST":
            prompts.append(request.post_data_json["prompt"])

    page.on("request", on_request)
    return prompts

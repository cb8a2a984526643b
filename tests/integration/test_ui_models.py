"""The workbench's model picker (issue 41): a server with both bundled models, one loaded
at a time. The top bar lists every model with its state; the writer picks one per story,
its requests name it (the server loads it on demand), the pick is kept with the story in
the library and comes back with it on another device; switching stories switches models;
a story whose model the server no longer serves falls back to the current one, and says so."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.ui_helpers import (
    PROMPT,
    expect,
    library_row,
    new_story,
    saved,
    set_settings,
    story_id,
    wait_finished,
)
from tests.support.server import RunningServer, run_server

GEMMA, SMOL = "gemma-3-270m-q4_k_m", "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ui-two-models")
    args = ["--model", "gemma-3-270m", "--models", SMOL, "--models-max", "1", "--n-ctx", "2048"]
    with run_server(tmp, *args) as server:
        yield server


def states(server: RunningServer) -> dict[str, str]:
    cards = httpx.get(f"{server.api_url}/models", timeout=30).json()["data"]
    return {card["id"]: card["state"] for card in cards}


def stored(server: RunningServer, sid: str) -> dict[str, Any]:
    response = httpx.get(f"{server.api_url}/stories/{sid}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def option(page: Any, model: str) -> Any:
    return page.get_by_test_id("model-pick").locator(f'option[value="{model}"]')


def sent_models(page: Any) -> list[str | None]:
    """Records the `model` of every completion the page sends from now on (None: none)."""
    models: list[str | None] = []

    def on_request(request: Any) -> None:
        if request.url.endswith("/v1/completions") and request.method == "POST":
            models.append(request.post_data_json.get("model"))

    page.on("request", on_request)
    return models


def generate(page: Any, text: str) -> None:
    set_settings(page, n=2, max_tokens=4)
    page.get_by_test_id("story").fill(text)
    page.get_by_test_id("generate").click()
    wait_finished(page, 2)


def open_in(page: Any, sid: str) -> None:
    page.get_by_test_id("to-library").click()
    library_row(page, sid).get_by_test_id("open-story").click()
    expect(page.get_by_test_id("story")).to_be_visible()


def test_each_story_is_written_by_the_model_picked_for_it(open_ui: Any, two: RunningServer) -> None:
    page = open_ui(two.base_url)
    sent = sent_models(page)
    picker = page.get_by_test_id("model-pick")
    # Every model, with its state; a new story has no pick: the server's current model.
    expect(picker).to_be_visible()
    expect(page.get_by_test_id("model-name")).to_be_hidden()
    expect(picker.locator("option")).to_have_count(3)
    expect(picker).to_have_value("")
    expect(option(page, GEMMA)).to_have_text(f"{GEMMA} · loaded")
    expect(option(page, SMOL)).to_have_text(re.compile(rf"^{SMOL} · (not loaded|asleep)$"))

    # Story A, picked for Gemma: written by it.
    picker.select_option(GEMMA)
    expect(page.get_by_test_id("notice")).to_contain_text(f"written by {GEMMA}")
    generate(page, PROMPT)
    expect(page.get_by_test_id("node-settings")).to_contain_text(GEMMA)
    assert sent and set(sent) == {GEMMA}, sent  # the warm-up read and the generation
    first = story_id(page)
    saved(page)

    # Story B, picked for SmolLM: its request loads SmolLM (Gemma goes: one at a time).
    new_story_from_library(page)
    expect(picker).to_have_value("")
    picker.select_option(SMOL)
    expect(picker).to_have_value(SMOL)
    sent.clear()
    generate(page, "The storm came in from the west, and the fishermen")
    expect(page.get_by_test_id("node-settings")).to_contain_text(SMOL)
    assert sent and set(sent) == {SMOL}, sent
    second = story_id(page)
    saved(page)
    assert states(two)[SMOL] == "loaded" and states(two)[GEMMA] != "loaded"
    expect(option(page, SMOL)).to_have_text(f"{SMOL} · loaded")
    expect(option(page, GEMMA)).to_have_text(re.compile(rf"^{GEMMA} · (asleep|unloading…)$"))
    assert stored(two, first)["model"] == GEMMA and stored(two, second)["model"] == SMOL

    # A reload opens the story again from the library, with its pick.
    page.reload()
    expect(page.get_by_test_id("model-pick")).to_have_value(SMOL)
    expect(page.get_by_test_id("story")).to_be_visible()

    # The library shows each story's model; switching stories switches the pick.
    page.get_by_test_id("to-library").click()
    expect(library_row(page, second).get_by_test_id("story-meta")).to_contain_text(SMOL)
    library_row(page, first).get_by_test_id("open-story").click()
    expect(picker).to_have_value(GEMMA)
    sent.clear()
    page.get_by_test_id("retry").click()
    expect(page.get_by_test_id("status")).to_have_text(re.compile(r"Loading the model|Gener"))
    wait_finished(page, 2)
    expect(page.get_by_test_id("node-settings")).to_contain_text(GEMMA)
    assert sent and set(sent) == {GEMMA}, sent
    assert states(two)[GEMMA] == "loaded"
    saved(page)

    # Another device (a fresh browser profile): the pick comes from the library.
    other = open_ui(two.base_url, library=True)
    library_row(other, second).get_by_test_id("open-story").click()
    expect(other.get_by_test_id("model-pick")).to_have_value(SMOL)
    other.get_by_test_id("retry").click()
    wait_finished(other, 2)
    expect(other.get_by_test_id("node-settings")).to_contain_text(SMOL)
    # Back to the server's current model: the pick is forgotten, on the server too.
    other.get_by_test_id("model-pick").select_option("")
    saved(other)
    assert stored(two, second)["model"] is None


def new_story_from_library(page: Any) -> None:
    page.get_by_test_id("to-library").click()
    new_story(page)


def test_a_story_whose_model_is_gone_falls_back_and_says_so(
    open_ui: Any, two: RunningServer
) -> None:
    made = httpx.post(
        f"{two.api_url}/stories",
        json={
            "name": "Retired",
            "model": "retired-13b",
            "current": 1,
            "nodes": [{"id": 1, "text": PROMPT}],
        },
        timeout=30,
    )
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    page = open_ui(two.base_url, library=True)
    library_row(page, sid).get_by_test_id("open-story").click()
    picker = page.get_by_test_id("model-pick")
    expect(picker).to_have_value("retired-13b")
    expect(option(page, "retired-13b")).to_have_text("retired-13b · not served here")
    state = page.get_by_test_id("model-state")
    expect(state).to_contain_text("retired-13b is not served here")
    expect(state).to_contain_text("writes this story")
    # It still generates (no 404: the request names no model), and keeps its pick.
    set_settings(page, n=2, max_tokens=4)
    page.get_by_test_id("retry").click()
    wait_finished(page, 2)
    node = page.get_by_test_id("node-settings")
    expect(node).to_contain_text(re.compile(f"{GEMMA}|{SMOL}"))
    saved(page)
    assert stored(two, sid)["model"] == "retired-13b"


def test_the_pick_merges_last_writer_wins_and_a_load_is_heard(
    open_ui: Any, two: RunningServer
) -> None:
    """The page's own logic, in its modules: a story's model in a save (web/merge.js: sent
    when changed, null to forget it; another tab's pick taken unless this one picked too,
    never a clash), and the server's loading notices read from a stream (web/api.js)."""
    page = open_ui(two.base_url, library=True)
    merged = page.evaluate(
        """async () => {
        const Tree = await import("./tree.js");
        const Merge = await import("./merge.js");
        const base = Tree.createTree({ name: "S" });
        const mine = Tree.clone(base);
        const out = {};
        out.none = "model" in Merge.diff(base, mine);
        mine.model = "smol";
        const patch = Merge.diff(base, mine);
        out.sent = patch.model;
        out.applied = Merge.applyPatch(Tree.clone(base), patch).model;
        mine.model = null;
        out.forget = Merge.diff({ ...base, model: "smol" }, mine).model;
        const changes = (model) => ({
          since: 1, revision: 2, next_id: 1, nodes: [], deleted: [], fields: { model },
        });
        const taken = Tree.clone(base);
        Merge.rebase(base, taken, changes("gemma"));
        out.taken = taken.model;
        const own = { ...Tree.clone(base), model: "smol" };
        const { conflicts } = Merge.rebase(base, own, changes("gemma"));
        out.own = own.model;
        out.conflicts = conflicts.length;
        out.fromServer = Merge.applyChanges(Tree.clone(own), changes(null)).model;
        return out;
    }"""
    )
    assert merged == {
        "none": False,
        "sent": "smol",
        "applied": "smol",
        "forget": None,
        "taken": "gemma",
        "own": "smol",
        "conflicts": 0,
        "fromServer": None,
    }
    asleep = next(name for name, state in states(two).items() if state != "loaded")
    heard = page.evaluate(
        """async (model) => {
        const { streamCompletion } = await import("./api.js");
        const notices = [];
        const chunks = [];
        await streamCompletion(
          { prompt: "Once upon a time", max_tokens: 2, n: 1, model },
          { session: "t", onChunk: (c) => chunks.push(c.model),
            onLoading: (name, seconds) => notices.push([name, seconds]) },
        );
        return { notices, chunks };
    }""",
        asleep,
    )
    assert heard["notices"] and all(name == asleep for name, _ in heard["notices"])
    assert all(isinstance(seconds, int) for _, seconds in heard["notices"])
    assert set(heard["chunks"]) == {asleep}
    assert states(two)[asleep] == "loaded"

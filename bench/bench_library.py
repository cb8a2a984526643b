"""The story library's costs, as a writer meets them: a save on a big story, reading it
whole and catching up, and the page's work for one key in a big tree.

    .venv/bin/python bench/bench_library.py [--nodes 1000] [--writes 100]

Against the real server (a temporary data folder) and Debian's chromium: makes a story
of --nodes nodes (a tree that forks three ways, as tests/integration/test_ui_library.py
does), then times --writes saves that each add one node (PATCH, SQLite synced to disk
before the answer), a GET of the whole story, a GET of the changes since one revision, and
in the page the synchronous work of one arrow key in the tree (it redraws the tree).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.server import RunningServer, run_server

PROMPT = "The lighthouse keeper found a letter on the rocks. It said:"


def forking_story(count: int) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = [{"id": 1, "text": PROMPT, "choices": []}]
    queue = [nodes[0]]
    while len(nodes) < count:
        parent = queue.pop(0)
        for via, word in enumerate(["north", "south", "home"]):
            if len(nodes) == count:
                break
            node_id = len(nodes) + 1
            added = f" Then #{node_id} went {word}."
            cards = [{"text": f" and {w}", "finish_reason": "stop", "tokens": 2} for w in "abc"]
            node = {
                "id": node_id,
                "parent": parent["id"],
                "via": via,
                "text": parent["text"] + added,
            }
            nodes.append({**node, "choices": cards, "model_chars": len(added)})
            queue.append(node)
    return nodes


def ms(samples: list[float]) -> str:
    """Two table cells: the median and the 95th percentile, in milliseconds."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1000:.1f} | {p95 * 1000:.1f}"


def server_side(server: RunningServer, nodes: int, writes: int) -> tuple[str, list[str]]:
    api = httpx.Client(base_url=server.api_url, timeout=120)
    started = time.perf_counter()
    story = api.post("/stories", json={"nodes": forking_story(nodes), "current": 40}).json()
    made = time.perf_counter() - started
    sid, revision = story["id"], story["revision"]
    saves = []
    for i in range(writes):
        node = {"id": nodes + 1 + i, "parent": 40, "text": PROMPT + f" Write {i}."}
        started = time.perf_counter()
        answer = api.patch(f"/stories/{sid}", json={"base_revision": revision, "nodes": [node]})
        saves.append(time.perf_counter() - started)
        revision = answer.json()["revision"]
    reads, since = [], []
    for _ in range(10):
        started = time.perf_counter()
        api.get(f"/stories/{sid}").raise_for_status()
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        api.get(f"/stories/{sid}", params={"since": revision - 1}).raise_for_status()
        since.append(time.perf_counter() - started)
    size = len(api.get(f"/stories/{sid}").content)
    rows = [
        f"| make the story ({nodes} nodes, {size / 1e6:.1f} MB of JSON) | {made * 1000:.1f} | |",
        f"| save: one node added (PATCH), ×{writes} | {ms(saves)} |",
        f"| read it whole (GET), ×10 | {ms(reads)} |",
        f"| catch up one revision (GET ?since), ×10 | {ms(since)} |",
    ]
    return sid, rows


def page_side(server: RunningServer, sid: str) -> list[str]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{server.base_url}/#story={sid}")
        page.locator('[data-testid="tree-node"][aria-current="true"]').wait_for()
        rows = page.get_by_test_id("tree-node").count()
        key = """(key) => {
            const node = document.querySelector('[data-testid="tree-node"][aria-current="true"]');
            node.focus();
            const started = performance.now();
            node.dispatchEvent(new KeyboardEvent("keydown", { key, bubbles: true }));
            return (performance.now() - started) / 1000;
        }"""
        walks = [page.evaluate(key, k) for _ in range(10) for k in ("ArrowUp", "ArrowDown")]
        page.get_by_test_id("tree-fold").click()
        folded_rows = page.get_by_test_id("tree-node").count()
        folded = [page.evaluate(key, k) for _ in range(10) for k in ("ArrowUp", "ArrowDown")]
        browser.close()
    return [
        f"| page: one arrow key, {rows} rows drawn, ×20 | {ms(walks)} |",
        f"| page: one arrow key after Fold others ({folded_rows} rows), ×20 | {ms(folded)} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(tmp), "--n-ctx", "2048") as server:
        sid, rows = server_side(server, args.nodes, args.writes)
        rows += page_side(server, sid)
    print(f"$ {' '.join(sys.argv)}")
    print("| what | median ms | p95 ms |")
    print("|---|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

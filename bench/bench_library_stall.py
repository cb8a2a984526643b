"""Does a big story's write stall another story's? (issue 38: a PATCH of every node of a
10,000-node story held the store's lock for 4 to 11 s, and another story's one-node write
waited 9.8 s.)

    .venv/bin/python bench/bench_library_stall.py [--nodes 9999] [--writes 40]

Against the real server (a temporary data folder): makes a story of --nodes nodes (two
chains, within the depth bound) and a one-node story, then times --writes one-node saves
of the small story, first alone, then while another client rewrites every node of the big
story (PATCHes of --nodes nodes, one after another), and the big rewrites themselves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.server import run_server


def big_story(count: int) -> list[dict[str, Any]]:
    half = count // 2
    return [
        {"id": i, "parent": None if i in (1, half + 1) else i - 1, "text": f"node {i} " * 4}
        for i in range(1, count + 1)
    ]


def small_saves(api: httpx.Client, sid: str, revision: int, writes: int) -> list[float]:
    took = []
    for i in range(writes):
        patch = {"base_revision": revision, "nodes": [{"id": 1, "text": f"draft {i}"}]}
        start = time.perf_counter()
        answer = api.patch(f"/stories/{sid}", json=patch)
        took.append(time.perf_counter() - start)
        answer.raise_for_status()
        revision = answer.json()["revision"]
    return took


def row(what: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    cells = f"{statistics.median(ordered) * 1000:.1f} | {p95 * 1000:.1f} | {ordered[-1] * 1000:.1f}"
    return f"| {what} | {cells} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=9_999)
    parser.add_argument("--writes", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(tmp), "--n-ctx", "512") as server:
        api = httpx.Client(base_url=server.api_url, timeout=120)
        big = api.post("/stories", json={"nodes": big_story(args.nodes)}).json()
        small = api.post("/stories", json={"nodes": [{"id": 1, "text": "Once."}]}).json()
        alone = small_saves(api, small["id"], 1, args.writes)
        stop, rewrites = threading.Event(), []

        def rewrite() -> None:
            revision, flag = big["revision"], True
            with httpx.Client(base_url=server.api_url, timeout=120) as other:
                while not stop.is_set():
                    nodes = [{"id": i, "bookmarked": flag} for i in range(1, args.nodes + 1)]
                    start = time.perf_counter()
                    answer = other.patch(
                        f"/stories/{big['id']}", json={"base_revision": revision, "nodes": nodes}
                    )
                    rewrites.append(time.perf_counter() - start)
                    revision, flag = answer.json()["revision"], not flag

        thread = threading.Thread(target=rewrite)
        thread.start()
        time.sleep(1.0)
        beside = small_saves(api, small["id"], args.writes + 1, args.writes)
        stop.set()
        thread.join()
        print(f"{args.nodes}-node story beside a one-node one; ms:\n")
        print("| what | median | p95 | max |\n|---|---:|---:|---:|")
        print(row(f"small story: one-node save, alone, ×{args.writes}", alone))
        print(row(f"small story: one-node save, beside the rewrites, ×{args.writes}", beside))
        print(row(f"big story: save of all {args.nodes} nodes, ×{len(rewrites)}", rewrites))


if __name__ == "__main__":
    main()

"""Which files of llama_srb one streamed /v1/completions (and chat) request runs through.

    .venv/bin/python bench/request_path.py [--n 2] [--max-tokens 8] [--n-ctx 2048]

The server runs in this process (uvicorn in a thread, the default bundled model); profile
hooks on every thread (`sys.setprofile`, `threading.setprofile`) record each llama_srb
file whose Python functions run while one streamed request per route is served, after a
warm-up request on another prompt. Also counted: the async generators of llama_srb that
ran (the layers a streamed event climbs through on its way out), and each route's static
import closure inside llama_srb/api (read with `ast`, as tests/unit/test_imports.py).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_srb
from llama_srb.api.app import create_app
from llama_srb.config import Settings
from tests.support.server import free_port

PACKAGE = Path(llama_srb.__file__).resolve().parent


class Recorder:
    """A profile hook: while `on`, the llama_srb files (in first-call order) whose
    functions run, and the async generator functions among them."""

    def __init__(self) -> None:
        self.on = False
        self.files: dict[str, None] = {}  # an ordered set
        self.generators: set[str] = set()

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if not self.on or event != "call":
            return
        code = frame.f_code
        if not (path := Path(code.co_filename)).is_relative_to(PACKAGE):
            return
        self.files[name := path.relative_to(PACKAGE).as_posix()] = None
        if code.co_flags & inspect.CO_ASYNC_GENERATOR:
            self.generators.add(f"{name}:{code.co_qualname}")


def stream_once(url: str, route: str, n: int, max_tokens: int) -> int:
    """One streamed request on a prompt never seen before; returns the events read."""
    text = f"{uuid.uuid4().hex}. Once upon a time"
    body: dict[str, object] = {"n": n, "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    chat = route.startswith("chat")
    body |= {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    events = 0
    with httpx.stream("POST", f"{url}/v1/{route}", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            events += line.startswith("data: ")
    return events


def api_closure(start: str) -> set[str]:
    """The llama_srb.api modules `start` imports, directly or through other api modules
    (they import with `from`: `from pkg import mod` names pkg.mod, `from mod import x` mod)."""
    files = {".".join(p.relative_to(PACKAGE.parent).parts)[:-3]: p for p in PACKAGE.rglob("*.py")}
    known = {name.removesuffix(".__init__"): path for name, path in files.items()}
    seen, todo = {start}, [start]
    while todo:
        for node in ast.walk(ast.parse(known[todo.pop()].read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in known else node.module
                    if target.startswith("llama_srb.api") and target in known.keys() - seen:
                        seen.add(target)
                        todo.append(target)
    return seen


def group(name: str) -> str:
    top = name.split("/", 1)[0]
    return f"{top}/" if top in ("api", "engine", "sampling") else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--n-ctx", type=int, default=2048)
    args = parser.parse_args()

    recorder = Recorder()
    sys.setprofile(recorder)
    threading.setprofile(recorder)  # before any thread starts: workers, engine, uvicorn
    port = free_port()
    app = create_app(Settings(port=port, n_ctx=args.n_ctx))
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    while not server.started or httpx.get(f"{url}/health", timeout=10).status_code != 200:
        time.sleep(0.2)
    runs: dict[str, tuple[int, dict[str, None], set[str]]] = {}
    for route in ("completions", "chat/completions"):
        stream_once(url, route, args.n, args.max_tokens)  # warm-up: first-call paths stay out
        recorder.files, recorder.generators, recorder.on = {}, set(), True
        events = stream_once(url, route, args.n, args.max_tokens)
        recorder.on = False
        runs[route] = (events, recorder.files, recorder.generators)
    server.should_exit = True
    thread.join(timeout=30)
    sys.setprofile(None)

    print(f"One streamed request per route (n={args.n}, max_tokens {args.max_tokens}): the")
    print("llama_srb files whose functions ran, in first-call order (then chat's own)\n")
    (c_events, c_files, c_gens), (h_events, h_files, h_gens) = runs.values()
    print(f"| group | completions ({c_events} events) | chat ({h_events} events) | files |")
    print("|---|---:|---:|---|")
    for name in ("api/", "engine/", "sampling/", "other"):
        mine = [f for f in c_files if group(f) == name]
        extra = [f"chat: {f}" for f in h_files if group(f) == name and f not in c_files]
        chat = sum(group(f) == name for f in h_files)
        print(f"| {name} | {len(mine)} | {chat} | {', '.join(mine + extra)} |")
    print(f"| **all** | **{len(c_files)}** | **{len(h_files)}** | |")
    for route, generators in (("completions", c_gens), ("chat", h_gens)):
        closure = api_closure(f"llama_srb.api.routes.{route.split('/')[0]}")
        print(f"\n{route}: {len(closure)} api modules in the route's static import closure;")
        print(f"{len(generators)} async generators ran: {', '.join(sorted(generators))}")
    print(
        f"\nreproduce: .venv/bin/python bench/request_path.py --n {args.n}"
        f" --max-tokens {args.max_tokens} --n-ctx {args.n_ctx}"
    )


if __name__ == "__main__":
    main()

"""The import graph of llama_srb, read with `ast`: no cycle between modules nor between
packages, and the layers point one way: native ← sampling ← engine ← api.

Every import counts, wherever it stands (inside functions and TYPE_CHECKING blocks too): a
cycle hidden behind a lazy import is still a cycle for whoever reads the code.
"""

from __future__ import annotations

import ast
import functools
import typing
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "llama_srb"
PACKAGE = "llama_srb"

# Lower layers never import higher ones. Top-level modules not listed (config, cli, …)
# are free to sit anywhere as long as the graph stays acyclic.
LAYERS = {"native": 0, "sampling": 1, "engine": 2, "stories": 2, "api": 3}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The llama_srb modules that module `name` imports."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from mod import x`, mod.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target == PACKAGE or not target.startswith(PACKAGE + "."):
                continue
            while target not in known and "." in target:  # `import a.b.c` of a name
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                yield target


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    known = modules()
    return {name: frozenset(imported(name, path, known)) for name, path in known.items()}


def package_of(module: str) -> str:
    """llama_srb.engine.kv → engine; llama_srb.native → native."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(edges: dict[str, frozenset[str]] | dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "llama_srb.engine.engine" in edges["llama_srb.engine.runtime"]
    assert "llama_srb.native" in edges["llama_srb.sampling.chain"]


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(graph()) == []


def test_no_package_imports_itself_through_others() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in graph().items():
        here = package_of(module)
        packages.setdefault(here, set()).update(package_of(t) for t in targets)
        packages[here].discard(here)
    assert cycles(packages) == []


def test_layers_point_down_only() -> None:
    upward = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if package_of(module) in LAYERS
        and package_of(target) in LAYERS
        and LAYERS[package_of(target)] > LAYERS[package_of(module)]
    ]
    assert upward == []


def test_the_engine_knows_nothing_of_the_api_or_the_settings() -> None:
    reaches = {
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if package_of(module) in ("native", "sampling", "engine")
        and package_of(target) in ("api", "config", "loader", "cli")
    }
    assert reaches == set()


# Inside api/, a request's path: schemas → input → service / render → routes → app.
API_STAGES = {"schemas": 0, "input": 1, "service": 2, "render": 2, "routes": 3, "app": 4}


def api_stage(module: str) -> str | None:
    """llama_srb.api.input.prompts → input; llama_srb.api.service → service; None for the
    shared pieces (errors, state, workers, metrics, …) that any stage may use."""
    parts = module.split(".")
    if parts[:2] != [PACKAGE, "api"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in API_STAGES else None


def test_the_api_reads_along_a_requests_path() -> None:
    backwards = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if (here := api_stage(module)) is not None
        and (there := api_stage(target)) is not None
        and (
            API_STAGES[there] > API_STAGES[here]
            or (here != there and API_STAGES[here] == API_STAGES[there])
        )
    ]
    assert backwards == []


# What the API may know of the engine: what it hands over (a spec, built into a
# submission), the outputs it gets back, the thread's doorway (runtime, generation) and
# what the engine publishes for other threads (the snapshot, the step watch, histograms).
# Never the request and branch objects, nor the bookkeeping that writes them.
ENGINE_SEAM = {
    f"{PACKAGE}.engine.{name}"
    for name in ("spec", "build", "outputs", "runtime", "generation", "watch", "stats", "histogram")
}


def test_the_api_holds_no_engine_object_only_ids_and_outputs() -> None:
    crossing = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.startswith(f"{PACKAGE}.api.")
        for target in targets
        if target.startswith(f"{PACKAGE}.engine.") and target not in ENGINE_SEAM
    ]
    assert crossing == []


# The loader builds the engine and the llama.cpp context and keeps them: the API takes from
# it only the loading, whose result is the face (served.py) that the API may hold.
LOADER_FOR_THE_API = {"load_engine", "available_memory"}  # a load, and whether it fits
FACE = f"{PACKAGE}.served"


def loader_names(path: Path) -> Iterator[str]:
    """What a module takes from llama_srb.loader: each name, or `*module*` for the module."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == f"{PACKAGE}.loader":
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            yield from ("*module*" for alias in node.names if alias.name == "loader")
        elif isinstance(node, ast.Import):
            yield from ("*module*" for a in node.names if a.name == f"{PACKAGE}.loader")


def test_the_api_takes_only_the_loading_from_the_loader() -> None:
    taken = {
        f"{module} takes loader.{name}"
        for module, path in modules().items()
        if module.startswith(f"{PACKAGE}.api.")
        for name in loader_names(path)
        if name not in LOADER_FOR_THE_API
    }
    assert taken == set()
    assert f"{PACKAGE}.loader" in graph()[f"{PACKAGE}.api.state"]  # the check reads imports


def _types(hint: object) -> Iterator[object]:
    """`hint` and every type inside it (generic arguments, a callable's parameters)."""
    yield hint
    for arg in typing.get_args(hint):
        for inner in arg if isinstance(arg, list) else [arg]:
            yield from _types(inner)


def test_the_face_the_api_sees_holds_no_engine_and_no_context() -> None:
    """api → loader → engine: what `load_engine` hands the API (served.py) names no engine
    object, no scheduler state and no llama.cpp context, in its imports or its types."""
    from llama_srb import loader, served
    from llama_srb.engine.context import DecodeContext
    from llama_srb.engine.engine import Engine
    from llama_srb.engine.kv import KvBudget
    from llama_srb.engine.request import Branch, Request
    from llama_srb.engine.scheduler import Scheduler
    from llama_srb.native import Context

    engine_imports = {t for t in graph()[FACE] if t.startswith(f"{PACKAGE}.engine.")}
    assert engine_imports <= ENGINE_SEAM, engine_imports - ENGINE_SEAM
    assert typing.get_type_hints(loader.load_engine)["return"] is served.Served
    hints = [typing.get_type_hints(served.Served)]
    for face in (served.Doorway, served.Tokenizer):
        members = [getattr(face, name) for name in dir(face) if not name.startswith("_")]
        for member in members:
            function = member.fget if isinstance(member, property) else member
            hints.append(typing.get_type_hints(function))
    named = {t for hint in hints for value in hint.values() for t in _types(value)}
    forbidden = {Engine, Context, DecodeContext, KvBudget, Scheduler, Request, Branch}
    assert named & forbidden == set()
    assert served.Doorway in named and served.Served.__dataclass_fields__  # read, not empty
    assert not hasattr(served.Doorway, "engine") and not hasattr(served.Doorway, "act")

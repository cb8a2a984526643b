"""What the docs say about the tree holds: every path they name exists, every relative
link and its anchor resolves, docs/design.md's code map names every module and no file
that is gone, and the README's benchmark tables are copies of docs/benchmarks.md's (the
numbers live there, once).

Paths are read from README.md, docs/*.md, and the strings and comments (docstrings
included) of llama_srb/, bench/ and tests/. Two forms count: from the repository root
(`llama_srb/…`, `tests/…`, `bench/…`, `docs/…`, `deploy/…`, a glob allowed), and inside
the package as its modules cite each other (`engine/kv.py`, `render/sse.py`, `sampling/`),
which must exist under llama_srb/ or llama_srb/api/.
"""

from __future__ import annotations

import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llama_srb"

# Not inside a longer path, a URL or a home folder (`~/.cache/llama-srb/...`); a path ends
# in a letter, a digit, `*` or `/` (so `docs/api.md.` and `docs/api.md#errors` end at `md`).
_NOT_AFTER = r"(?<![\w./~-])"
ROOTED = re.compile(_NOT_AFTER + r"((?:llama_srb|tests|bench|docs|deploy)/(?:[\w.*/-]*[\w*/])?)")
# Inside the package: a file with a source extension, or a folder (`engine/`) followed by
# the end of a word.
PACKAGE_RELATIVE = re.compile(
    _NOT_AFTER
    + r"((?:api|engine|sampling|stories|web|templates|input|render|routes|schemas)/"
    + r"(?:[\w*-]+/)*(?:[\w*-]+\.(?:py|pyi|c|js|css|html|jinja)\b|(?=[\s`'\",);:.])))"
)


def _python_text(path: Path) -> str:
    """A module's strings and comments: its docstrings and what its comments cite."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.STRING, tokenize.COMMENT))


@functools.cache
def _sources() -> tuple[tuple[str, str], ...]:
    """(file, text) of every document and module whose paths are checked."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    modules = [
        *sorted(PACKAGE.rglob("*.py")),
        *sorted((ROOT / "bench").glob("*.py")),
        *sorted((ROOT / "tests").rglob("*.py")),
    ]
    return (
        *((str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in docs),
        *((str(p.relative_to(ROOT)), _python_text(p)) for p in modules),
    )


def _named(pattern: re.Pattern[str]) -> dict[str, set[str]]:
    """Each path `pattern` finds, and the files that name it."""
    found: dict[str, set[str]] = {}
    for name, text in _sources():
        for match in pattern.finditer(text):
            found.setdefault(match.group(1), set()).add(name)
    return found


def _exists(base: Path, path: str) -> bool:
    return any(base.glob(path)) if "*" in path else (base / path).exists()


def test_every_path_named_from_the_root_exists() -> None:
    named = _named(ROOTED)
    # the pattern finds what it should: a hundred and more paths, of every kind
    assert len(named) >= 100, sorted(named)
    assert {"llama_srb/sampling/_rows.c", "docs/benchmarks.md", "bench/request_path.py"} <= set(
        named
    )
    assert any(p.startswith("tests/") for p in named)
    assert any(p.startswith("deploy/") for p in named)
    missing = {p: sorted(files) for p, files in named.items() if not _exists(ROOT, p)}
    assert not missing, f"paths named that do not exist (path: where): {missing}"


def test_every_path_named_inside_the_package_exists() -> None:
    named = _named(PACKAGE_RELATIVE)
    assert len(named) >= 50, sorted(named)
    assert {"engine/branch_step.py", "sampling/cut.py", "render/sse.py", "engine/"} <= set(named)
    missing = {
        p: sorted(files)
        for p, files in named.items()
        if not (_exists(PACKAGE, p) or _exists(PACKAGE / "api", p))
    }
    assert not missing, f"paths named that do not exist (path: where): {missing}"


def test_the_path_patterns_take_a_path_and_nothing_around_it() -> None:
    text = (
        "see `docs/api.md#errors`, docs/benchmarks.md. bench/bench_cut.py's table; "
        "tests/unit/test_cut.py::test_x, tests/integration/test_ui_*.py, "
        "~/.cache/llama-srb/kv, https://github.com/o/r/tests/x.py and engine/kv.py, "
        "`render/` and llama_srb/engine/kv.py"
    )
    assert [m.group(1) for m in ROOTED.finditer(text)] == [
        "docs/api.md",
        "docs/benchmarks.md",
        "bench/bench_cut.py",
        "tests/unit/test_cut.py",
        "tests/integration/test_ui_*.py",
        "llama_srb/engine/kv.py",
    ]
    assert [m.group(1) for m in PACKAGE_RELATIVE.finditer(text)] == ["engine/kv.py", "render/"]


# -- links ---------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def _anchors(path: Path) -> frozenset[str]:
    anchors: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#+ (.*)", line)):
            anchor, n = _anchor(heading.group(1)), 0
            while (anchor if n == 0 else f"{anchor}-{n}") in anchors:
                n += 1  # GitHub numbers repeated headings
            anchors.add(anchor if n == 0 else f"{anchor}-{n}")
    return frozenset(anchors)


def _links() -> Iterator[tuple[Path, str]]:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in LINK.finditer(doc.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", match.group(1)):  # http:, https:, mailto:
                yield doc, match.group(1)


def test_every_relative_link_and_its_anchor_resolves() -> None:
    links = list(_links())
    assert len(links) >= 100
    broken = []
    for doc, link in links:
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists():
            broken.append(f"{doc.name}: {link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{doc.name}: {link} (no such heading)")
    assert not broken, broken


# -- docs/design.md's code map ----------------------------------------------------------------


def _code_map() -> set[str]:
    """The paths the code map names: each bullet's `llama_srb/...` folder, and the names
    after it, relative to it."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("Code map (")
    block = text[start : text.index("Imports point one way", start)]
    named: set[str] = set()
    for bullet in block.split("\n- ")[1:]:
        base = ""
        for name in re.findall(r"`([^`]+)`", bullet):
            if name.startswith("llama_srb/"):
                base = name
                named.add(name)
            else:
                assert base, f"{name!r} before any folder in the code map"
                named.add(base + name)
    return named


def _modules() -> set[str]:
    """What the code map must name: the modules of the package's top level and of its
    main packages, and every folder of the package and of api/."""
    required: set[str] = set()
    for folder in (PACKAGE, *(PACKAGE / p for p in ("engine", "sampling", "stories", "api"))):
        for path in [*folder.glob("*.py"), *folder.glob("*.c")]:
            if path.name != "__init__.py":
                required.add(str(path.relative_to(ROOT)))
    for folder in (PACKAGE, PACKAGE / "api"):
        for path in folder.iterdir():
            if path.is_dir() and not path.name.startswith(("_", ".")):
                required.add(f"{path.relative_to(ROOT)}/")
    return required


def test_the_code_map_names_every_module_and_nothing_that_is_gone() -> None:
    named, required = _code_map(), _modules()
    assert len(required) >= 60  # the tree was read
    gone = sorted(p for p in named if not (ROOT / p).exists())
    assert not gone, f"docs/design.md's code map names what is gone: {gone}"
    unnamed = sorted(required - named)
    assert not unnamed, f"docs/design.md's code map does not name: {unnamed}"


# -- the README's numbers --------------------------------------------------------------------


def _tables(text: str) -> list[list[str]]:
    """Each markdown table of `text`: its lines, the header first."""
    tables: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        row = line.startswith("|")
        if row and not previous:
            tables.append([])
        if row:
            tables[-1].append(line.rstrip())
        previous = row
    return tables


def test_the_readmes_benchmark_tables_are_copies_of_docs_benchmarks() -> None:
    """The README shows a headline table per topic; the numbers live in benchmarks.md:
    each README table is a header and rows of one table there, copied as they are."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("\n## Benchmarks\n")
    section = readme[start : readme.index("\n## ", start + 1)]
    assert "→" not in section, "before → after belongs in docs/benchmarks.md"
    tables = _tables(section)
    assert len(tables) >= 2
    benchmarks = _tables((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    for table in tables:
        assert any(t[0] == table[0] and set(table) <= set(t) for t in benchmarks), (
            f"not a copy of a docs/benchmarks.md table: {table[0]}"
        )

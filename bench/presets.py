"""Request bodies the host-time benchmarks send: our defaults, greedy, and the writer presets
SillyTavern ships (read from its npm package, sent as its llama.cpp API type sends them).

SillyTavern 1.19.0 keeps its text-completion presets in
`default/content/presets/textgen/*.json` and its default settings in
`default/content/settings.json`; `public/scripts/textgen-settings.js`
(`getTextGenGenerationData`) maps them onto a request body. For the llama.cpp type the
sampler settings go out under llama.cpp's names, with the preset's `samplers` order.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

SILLYTAVERN = "sillytavern@1.19.0"
CACHE = Path.home() / ".cache" / "llama-srb" / "sillytavern-1.19.0"

Body = dict[str, Any]


def sillytavern_package(cache: Path = CACHE) -> Path:
    """The unpacked npm package (downloaded once from the npm registry)."""
    package = cache / "package"
    if not package.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        name = subprocess.run(
            ["npm", "pack", SILLYTAVERN, "--silent"],
            cwd=cache,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[-1]
        with tarfile.open(cache / name) as archive:
            archive.extractall(cache, filter="data")
    return package


def llamacpp_body(preset: dict[str, Any]) -> Body:
    """A preset's sampler settings as SillyTavern's llama.cpp type sends them."""
    body: Body = {
        "temperature": preset["temp"],
        "top_k": preset["top_k"],
        "top_p": preset["top_p"],
        "min_p": preset["min_p"],
        "typical_p": preset["typical_p"],
        "repeat_penalty": preset["rep_pen"],
        "repeat_last_n": preset["rep_pen_range"],
        "frequency_penalty": preset.get("freq_pen", 0),
        "presence_penalty": preset.get("presence_pen", 0),
        "dry_multiplier": preset.get("dry_multiplier", 0),
        "xtc_probability": preset.get("xtc_probability", 0),
        "xtc_threshold": preset.get("xtc_threshold", 0.1),
        "top_n_sigma": preset.get("nsigma", 0),
        "mirostat": preset.get("mirostat_mode", 0),
        "samplers": preset["samplers"],
    }
    return body


REQUEST_JS = Path(__file__).parents[1] / "tests/integration/sillytavern/request.mjs"


def sillytavern_request(prompt: str, n: int, max_tokens: int, stop: list[str]) -> Body:
    """The whole /completion body SillyTavern's llama.cpp type sends on its default settings
    with "Multiple swipes per generation" at `n`: built by its own getTextGenGenerationData,
    run in node (tests/integration/sillytavern/request.mjs says how)."""
    case = {
        "type": "llamacpp",
        "preset": None,
        "n": n,
        "maxTokens": max_tokens,
        "stop": stop,
        "prompt": prompt,
        "serverUrl": "http://127.0.0.1/v1",  # the body names it; nothing is sent there
        "model": "",
    }
    out = subprocess.run(
        ["node", str(REQUEST_JS), str(sillytavern_package())],
        input=json.dumps([case]),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    body: Body = json.loads(out.stdout)["bodies"][0]
    return body


def sillytavern_presets(package: Path) -> dict[str, Body]:
    """`st-default` (its default settings) and one body per shipped text-completion preset."""
    presets: dict[str, Body] = {}
    settings = json.loads((package / "default/content/settings.json").read_text())
    presets["st-settings"] = llamacpp_body(settings["textgenerationwebui_settings"])
    for path in sorted((package / "default/content/presets/textgen").glob("*.json")):
        presets[f"st-{path.stem.lower()}"] = llamacpp_body(json.loads(path.read_text()))
    return presets


JSON_SCHEMA: Body = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}

OURS: dict[str, Body] = {
    "defaults": {},
    "greedy": {"temperature": 0},
    "topk0-minp": {"top_k": 0, "min_p": 0.05},  # top-p 0.95 (the default) first, then min-p
    "min-p": {"top_k": 0, "top_p": 1.0, "min_p": 0.1},  # min-p first (SillyTavern's Universal)
    "top-p-alone": {"top_k": 0, "min_p": 0},  # top-p 0.95 the only filter
    "penalties-dry": {"repeat_penalty": 1.1, "dry_multiplier": 0.8},
    "json-schema": {"json_schema": JSON_SCHEMA},
    "banned-strings": {"banned_strings": ["the sea", "lighthouse", "suddenly"]},
}


def all_presets(with_sillytavern: bool = True) -> dict[str, Body]:
    presets = dict(OURS)
    if with_sillytavern:
        presets.update(sillytavern_presets(sillytavern_package()))
    return presets

"""A quantized KV cache (--cache-type-k / --cache-type-v) with the real models: the server
serves n branches with it, and its disk tier keeps its stories apart from those of other
types (a story saved in q8_0 is never restored into an f16 cache, and is still there for
the next q8_0 server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from llama_srb.engine.tiers import MAGIC, SUFFIX
from tests.integration.bundled import SMOLLM2
from tests.support.server import RunningServer, run_server

Q8 = ("--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
STORY = (
    "The rain had not stopped for three days when Ilse found the letter under the floorboards"
    " of her grandmother's kitchen. The envelope was yellow and brittle, and the handwriting on"
    " it belonged to someone she had never met. She read it by the window, twice,"
)


def complete(server: RunningServer, n: int) -> dict[str, Any]:
    body = {"prompt": STORY, "n": n, "max_tokens": 8, "seed": 7, "temperature": 0.9}
    response = httpx.post(f"{server.api_url}/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def header(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    parsed: dict[str, Any] = json.loads(data[start : start + length])
    return parsed


def test_a_q8_0_kv_cache_serves_n_4(tmp_path: Path, bundled_model: str) -> None:
    with run_server(tmp_path, "--model", bundled_model, "--n-ctx", "2048", *Q8) as server:
        answer = complete(server, n=4)
        log = server.log()
    assert "KV cache q8_0/q8_0, flash attention on" in log
    choices = answer["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1, 2, 3]
    assert all(c["text"] and c["finish_reason"] == "length" for c in choices)
    assert answer["usage"]["completion_tokens"] == 4 * 8


@pytest.mark.models(SMOLLM2)
def test_a_story_saved_in_q8_0_is_never_restored_into_f16(tmp_path: Path) -> None:
    """SmolLM2 only: this tests the tier's folders and headers, not the model."""
    cache = tmp_path / "kv"
    args = ("--model", SMOLLM2, "--n-ctx", "2048", "--cache-dir", str(cache))
    with run_server(tmp_path, *args, *Q8) as server:
        complete(server, n=4)
    saved = list(cache.glob(f"*-q8_0-q8_0/*{SUFFIX}"))  # at shutdown, in a folder of its own
    assert saved and all(header(path)["kv_types"] == "q8_0/q8_0" for path in saved)
    with run_server(tmp_path, *args) as f16:
        assert cached(complete(f16, n=1)) == 0
        assert f16.metric('llama_srb_cache_tier_entries{tier="disk"}') == 0
    assert all(path.exists() for path in saved)  # not removed as foreign
    with run_server(tmp_path, *args, *Q8) as again:
        assert cached(complete(again, n=1)) >= 32
        assert again.metric('llama_srb_cache_tier_hits_total{tier="disk"}') == 1

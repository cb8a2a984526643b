"""Models on demand with both bundled models in one server (api/models.py): a request
naming a model loads it, one more than --models-max unloads the least recently used (its
stories to the disk tier, read back when it returns), the clients' load and unload routes
(llama-server's router, TabbyAPI's) under an admin's key, idle models sleep, and a broken
or oversized file is refused while the running model keeps serving.

The routes' shapes follow llama.cpp's tools/server/README.md (router mode: GET /models,
POST /models/load and /models/unload with `{"model"}`, `status.value`) and TabbyAPI's
endpoints/core/router.py and endpoints/core/types/model.py (`/v1/model/load` with
`model_name`, its progress events `module`/`modules`/`status`, `x-admin-key`), and
SillyTavern's Tabby connection (src/endpoints/backends/text-completions.js: the list at
/v1/model/list and the card at /v1/model with `x-api-key` and a bearer key).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.st_client import st_textgen_stream
from tests.integration.test_sillytavern_presets import N, built
from tests.support.server import RunningServer, run_server

GEMMA, SMOL = "gemma-3-270m-q4_k_m", "smollm2-135m-instruct"
BOSS = {"Authorization": "Bearer k-boss"}
ALICE = {"Authorization": "Bearer k-alice"}
STORY = (
    "The lighthouse keeper's daughter kept a ledger of every ship that passed. In the"
    " spring of the flood year she wrote down a schooner with black sails, a whaler"
    " that limped home with half its crew, and a mail boat that never came back."
) * 12  # about 600 tokens


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Both bundled models, one loaded at a time; a models folder with a file that is no
    GGUF and one too large for any memory; keys of an admin and a writer."""
    tmp = tmp_path_factory.mktemp("two-models")
    folder = tmp / "models"
    folder.mkdir()
    (folder / "broken.gguf").write_bytes(b"<html>not found</html>")
    with (folder / "enormous.gguf").open("wb") as sparse:  # 4 TiB on paper, nothing on disk
        sparse.write(b"GGUF")
        sparse.truncate(4 << 40)
    args = ["--model", "gemma-3-270m", "--models", "smollm2-135m-instruct"]
    args += ["--models-dir", str(folder), "--models-max", "1", "--n-ctx", "4096"]
    args += ["--api-key", "admin:boss: k-boss", "--api-key", "alice: k-alice"]
    with run_server(tmp, *args) as server:
        yield server


def complete(server: RunningServer, model: str | None, prompt: str, **more: Any) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, **more}
    if model is not None:
        body["model"] = model
    return httpx.post(f"{server.api_url}/completions", json=body, headers=ALICE, timeout=300)


def states(server: RunningServer) -> dict[str, str]:
    cards = httpx.get(f"{server.api_url}/models", headers=ALICE, timeout=30).json()["data"]
    return {card["id"]: card["state"] for card in cards}


def wait_until(condition: Any, within: float = 120) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.2)


def test_a_story_comes_back_from_the_tier_after_switching_away_and_back(
    two: RunningServer,
) -> None:
    first = complete(two, GEMMA, STORY)
    assert first.status_code == 200, first.text
    story_tokens = first.json()["usage"]["prompt_tokens"]
    other = complete(two, SMOL, "Write a haiku about rain.")
    assert other.status_code == 200 and other.json()["model"] == SMOL
    assert states(two)[GEMMA] == "sleeping" and states(two)[SMOL] == "loaded"
    back = complete(two, GEMMA, STORY)
    assert back.status_code == 200 and back.json()["model"] == GEMMA
    cached = back.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= story_tokens - 2, (cached, story_tokens)  # from the disk tier


def test_a_streamed_request_sees_the_load_then_its_chunks(two: RunningServer) -> None:
    complete(two, GEMMA, "Once upon a time")  # the other one sleeps now
    body = {"model": SMOL, "prompt": "Once", "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST", f"{two.api_url}/completions", json=body, headers=ALICE, timeout=300
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[0].startswith(f": loading model {SMOL} (")
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {SMOL}
    assert lines[-1] == "data: [DONE]"


def test_the_router_s_routes_load_and_unload_for_an_admin_only(two: RunningServer) -> None:
    base = two.base_url
    cards = httpx.get(f"{base}/models", headers=ALICE, timeout=30).json()["data"]
    assert {c["id"] for c in cards} >= {GEMMA, SMOL, "broken", "enormous"}
    assert all(c["status"]["value"] in {"loaded", "loading", "unloaded", "sleeping"} for c in cards)
    refused = httpx.post(f"{base}/models/load", json={"model": SMOL}, headers=ALICE, timeout=30)
    assert refused.status_code == 403
    if states(two)[SMOL] == "loaded":
        complete(two, GEMMA, "Once")
    load = httpx.post(f"{base}/models/load", json={"model": SMOL}, headers=BOSS, timeout=30)
    assert load.json() == {"success": True}
    wait_until(lambda: states(two)[SMOL] == "loaded")
    assert states(two)[GEMMA] == "sleeping"
    unload = httpx.post(f"{base}/models/unload", json={"model": SMOL}, headers=BOSS, timeout=30)
    assert unload.json() == {"success": True}
    wait_until(lambda: states(two)[SMOL] == "sleeping")
    health = httpx.get(f"{base}/health", timeout=30).json()  # none loaded: still serving
    assert health["status"] == "ok" and health["models"][SMOL] == "sleeping"


def test_tabby_s_load_stream_and_sillytavern_s_list(two: RunningServer) -> None:
    tavern = {"x-api-key": "k-alice", "Authorization": "Bearer k-alice"}
    listed = httpx.get(f"{two.api_url}/model/list", headers=tavern, timeout=30).json()
    assert {GEMMA, SMOL} <= {m["id"] for m in listed["data"]}
    admin = {"x-admin-key": "k-boss"}
    body = {"model_name": SMOL}
    with httpx.stream(
        "POST", f"{two.api_url}/model/load", json=body, headers=admin, timeout=300
    ) as response:
        events = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data:")
        ]
    assert events[-1] == {"model_type": "model", "module": 1, "modules": 1, "status": "finished"}
    card = httpx.get(f"{two.api_url}/model", headers=tavern, timeout=30).json()
    assert card["id"] == SMOL and card["parameters"]["max_seq_len"] == 4096
    assert httpx.get(f"{two.api_url}/auth/permission", headers=admin).json() == {
        "permission": "admin"
    }


@pytest.mark.parametrize(("api_type", "model"), [("tabby", SMOL), ("llamacpp", GEMMA)])
def test_sillytavern_s_model_picker_switches_models(
    two: RunningServer, api_type: str, model: str
) -> None:
    """SillyTavern 1.19's Tabby and llama.cpp types send the model picked from the list
    (textgen-settings.js getTextGenModel): its body, built by its own code, loads that model,
    and its stream reader reads the answer past the loading notices."""
    other = GEMMA if model == SMOL else SMOL
    assert complete(two, other, "Once").status_code == 200  # the picked one is not loaded
    body = built(two.base_url, model)["bodies"][(api_type, "(default settings)")]
    assert body["model"] == model
    answer = st_textgen_stream(api_type, two, {**body, "max_tokens": 8, "n_predict": 8}, "k-alice")
    assert answer["text"] and len(answer["swipes"]) == N - 1
    assert states(two)[model] == "loaded"


def test_a_broken_or_oversized_file_is_refused_and_the_running_model_serves(
    two: RunningServer,
) -> None:
    assert complete(two, GEMMA, "Once").status_code == 200
    broken = complete(two, "broken", "Once")
    assert broken.status_code == 503 and broken.json()["error"]["code"] == "model_load_failed"
    assert "is not a GGUF file" in broken.json()["error"]["message"]
    enormous = complete(two, "enormous", "Once")
    assert enormous.status_code == 503 and enormous.json()["error"]["code"] == "model_too_large"
    assert "needs 4096.0 GiB for its weights" in enormous.json()["error"]["message"]
    assert states(two)[GEMMA] == "loaded"  # refused before anything was unloaded
    assert states(two)["broken"] == "failed"
    assert complete(two, None, "Once").json()["model"] == GEMMA


def test_an_idle_model_sleeps_and_its_story_returns_from_disk(tmp_path: Path) -> None:
    with run_server(tmp_path, "--model", "smollm2-135m-instruct", "--sleep-idle-seconds", "2") as s:
        first = complete(s, None, STORY)
        wait_until(lambda: states(s)[SMOL] == "sleeping", within=60)
        assert httpx.get(f"{s.base_url}/health", timeout=30).json()["status"] == "ok"
        again = complete(s, SMOL, STORY)
        assert again.status_code == 200
        cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first.json()["usage"]["prompt_tokens"] - 2

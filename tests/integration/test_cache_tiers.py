"""The prefix cache's host-memory and disk tiers with the real model and server: a story
evicted from the live cells, or left behind by a restart, comes back from a tier and
continues exactly as if it had stayed; files that are cut short, corrupt, foreign or on
a disk that refuses writes are skipped with a log line while the server serves.

Prompts go as token ids (llama.cpp's /completion, `return_tokens`), so that a follow-up
extends the saved path token for token: text would be tokenized again at the seam."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from llama_srb.engine.tiers import MAGIC, SUFFIX
from tests.integration.bundled import GEMMA, SMOLLM2
from tests.support.paths import assert_same_greedy, native_steps
from tests.support.server import RunningServer, run_server

CHAPTER = (
    " The rain had not stopped for three days when Ilse found the letter under the"
    " floorboards of her grandmother's kitchen. The envelope was yellow and brittle, and the"
    " handwriting on it belonged to someone she had never met."
)
MORE = " She counted the pages by the window: one, two, three, four, five, six,"  # a refrain: sure of what comes next
SMALL = ("--n-ctx", "640", "--cache-paths", "4")  # two stories do not fit in the live cells


def tokenize(server: RunningServer, text: str, add_special: bool = True) -> list[int]:
    response = httpx.post(
        f"{server.base_url}/tokenize",
        json={"content": text, "add_special": add_special},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return [int(t) for t in response.json()["tokens"]]


def generate(server: RunningServer, prompt: list[int], n_predict: int = 16) -> dict[str, Any]:
    """Greedy, on /completion: its `tokens` and `tokens_cached` (restored ones included)."""
    response = httpx.post(
        f"{server.base_url}/completion",
        json={
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0,
            "ignore_eos": True,
            "return_tokens": True,
            "n_probs": 2,
        },
        timeout=300,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def new_story(server: RunningServer, repeats: int = 3, title: str = "Ilse") -> list[int]:
    """A story (about 45 tokens a repeat); each title makes another. Fixed text, never
    random: the greedy answers these tests compare are checked for near ties
    (tests/support/paths.py), which is a property of the prompt."""
    title = (
        f"The tale of {title}, as the innkeeper's daughter told it to the travellers on the night"
    )
    return tokenize(server, f"{title} of the great storm." + CHAPTER * repeats)


def same_greedy(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two greedy answers from two paths agree up to their first near tie."""
    assert_same_greedy(native_steps(a), native_steps(b))


def continuation(server: RunningServer, story: list[int], first: dict[str, Any]) -> list[int]:
    """The story, what the model wrote, and a sentence more: it extends the saved path."""
    return story + first["tokens"] + tokenize(server, MORE, add_special=False)


def tier_hits(server: RunningServer, tier: str) -> float:
    return server.metric(f'llama_srb_cache_tier_hits_total{{tier="{tier}"}}')


def test_a_story_continues_from_disk_after_a_restart(tmp_path: Path, bundled_model: str) -> None:
    """Stop the server, start it again on the same --cache-dir: the story is restored,
    and the greedy continuation is the one a server that never stopped gives."""
    cache = tmp_path / "kv"
    with run_server(tmp_path, "--model", bundled_model, "--cache-dir", str(cache)) as server:
        story = new_story(server, 8)
        first = generate(server, story)
    assert list(cache.glob(f"*/*{SUFFIX}")), "the cached story was not written at shutdown"
    with run_server(tmp_path, "--model", bundled_model, "--cache-dir", str(cache)) as server:
        restored = generate(server, continuation(server, story, first))
        assert tier_hits(server, "disk") == 1
        assert "restored" in server.log()
    with run_server(tmp_path, "--model", bundled_model) as never_stopped:
        assert generate(never_stopped, story)["tokens"] == first["tokens"]  # the same path
        kept_live = generate(never_stopped, continuation(never_stopped, story, first))
    assert restored["tokens_cached"] >= len(story) + len(first["tokens"]) - 1
    assert kept_live["tokens_cached"] >= len(story) + len(first["tokens"]) - 1
    same_greedy(restored, kept_live)


def test_an_evicted_story_comes_back_from_host_memory(tmp_path: Path, bundled_model: str) -> None:
    """Two stories that do not fit in the live cells together: the first is evicted to
    host memory (no disk tier here) and restored when it is continued, exactly."""
    with run_server(tmp_path, "--model", bundled_model, *SMALL, "--cache-disk", "0") as server:
        story = new_story(server, 8)
        first = generate(server, story)
        generate(server, new_story(server, 8, "Marek"))  # pushes the first out of the live cells
        assert server.metric('llama_srb_cache_tier_entries{tier="host"}') >= 1
        restored = generate(server, continuation(server, story, first))
        assert tier_hits(server, "host") == 1
    assert restored["tokens_cached"] >= len(story) + len(first["tokens"]) - 1
    with run_server(tmp_path, "--model", bundled_model, "--cache-ram", "0") as reference:
        generate(reference, story)
        kept_live = generate(reference, continuation(reference, story, first))
    same_greedy(restored, kept_live)


def test_a_fork_from_inside_a_saved_story_is_exact_or_read_again(
    tmp_path: Path, bundled_model: str
) -> None:
    """A new ending from the middle of an evicted story forks from inside the saved path.
    SmolLM2 (full attention) restores those cells exactly: the text is the one a cold
    server writes. Gemma 3's sliding-window layers were saved for the ends of the answer
    and of the prompt only, so it reads the story again (as any prompt is read: its text
    may differ from a cold server's in a token now and then, as where other stories' cells
    lie changes the logits a little: README, Known limits)."""
    with run_server(tmp_path, "--model", bundled_model, *SMALL, "--cache-disk", "0") as server:
        story = new_story(server, 8)
        generate(server, story)
        generate(server, new_story(server, 8, "Marek"))  # pushes the first out of the live cells
        fork = story[: len(story) // 2] + tokenize(server, MORE, add_special=False)
        forked = generate(server, fork)
        hits = tier_hits(server, "host")
    if bundled_model == GEMMA:
        assert hits == 0 and forked["tokens_cached"] == 0
        return
    assert hits == 1 and forked["tokens_cached"] >= len(story) // 2
    with run_server(tmp_path, "--model", bundled_model, "--cache-ram", "0") as reference:
        cold = generate(reference, fork)
    same_greedy(forked, cold)


def test_a_swipe_on_an_evicted_story_restores_its_prompt(
    tmp_path: Path, bundled_model: str
) -> None:
    """The same prompt again after its answer was evicted (a swipe, a regenerate): the
    prompt comes back from host memory, on Gemma 3 too (an entry that ends with the
    prompt is saved beside the answer's), and the answer agrees with the first."""
    with run_server(tmp_path, "--model", bundled_model, *SMALL, "--cache-disk", "0") as server:
        story = new_story(server, 8)
        first = generate(server, story, 12)
        generate(server, new_story(server, 8, "Marek"))  # pushes the story out
        again = generate(server, story, 12)
        assert tier_hits(server, "host") == 1
    same_greedy(again, first)
    assert again["tokens_cached"] == len(story) - 1


# -- faults ---------------------------------------------------------------------------------


@pytest.fixture
def saved_story(tmp_path: Path) -> tuple[Path, list[int], dict[str, Any]]:
    """A cache folder holding one saved story (and the story's first answer). SmolLM2
    only, the smaller model, for the fault tests: they test files, not the model."""
    cache = tmp_path / "kv"
    with run_server(tmp_path, "--model", SMOLLM2, "--cache-dir", str(cache)) as server:
        story = new_story(server, 4)
        first = generate(server, story)
    return cache, story, first


def saved_file(cache: Path) -> Path:
    (path,) = cache.glob(f"*/*{SUFFIX}")
    return path


def restart_and_continue(
    tmp_path: Path, cache: Path, story: list[int], first: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    with run_server(tmp_path, "--model", SMOLLM2, "--cache-dir", str(cache)) as server:
        answer = generate(server, continuation(server, story, first))
        return answer, server.log()


def test_a_truncated_file_is_removed_at_start(saved_story: Any, tmp_path: Path) -> None:
    cache, story, first = saved_story
    path = saved_file(cache)
    path.write_bytes(path.read_bytes()[:-100])
    answer, log = restart_and_continue(tmp_path, cache, story, first)
    assert "truncated" in log and not path.exists()
    assert answer["tokens_cached"] == 0 and len(answer["tokens"]) == 16


def test_a_corrupted_byte_is_caught_by_the_checksum(saved_story: Any, tmp_path: Path) -> None:
    cache, story, first = saved_story
    path = saved_file(cache)
    data = bytearray(path.read_bytes())
    data[-1000] ^= 0xFF  # inside the KV payload: only the checksum can tell
    path.write_bytes(bytes(data))
    answer, log = restart_and_continue(tmp_path, cache, story, first)
    assert "checksum mismatch" in log and not path.exists()
    assert answer["tokens_cached"] == 0 and len(answer["tokens"]) == 16


def test_a_file_for_other_cells_is_removed(saved_story: Any, tmp_path: Path) -> None:
    """A file whose header names another llama.cpp build (a stale file after an upgrade)."""
    cache, story, first = saved_story
    path = saved_file(cache)
    data = path.read_bytes()
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    header = json.loads(data[start : start + length])
    header["llama_cpp"] = "0.0.1"
    encoded = json.dumps(header).encode()
    path.write_bytes(
        data[: len(MAGIC)] + len(encoded).to_bytes(4, "little") + encoded + data[start + length :]
    )
    answer, log = restart_and_continue(tmp_path, cache, story, first)
    assert "llama_cpp differ" in log and not path.exists()
    assert answer["tokens_cached"] == 0 and len(answer["tokens"]) == 16


def test_a_disk_that_refuses_writes_turns_the_tier_off(tmp_path: Path) -> None:
    """The cache folder cannot be created (a file is in the way: root ignores a read-only
    folder's permissions, so this is how a test makes every write fail): a warning, and
    the server serves, evictions going to host memory only."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    args = ("--model", SMOLLM2, *SMALL, "--cache-dir", str(blocker / "kv"))
    with run_server(tmp_path, *args) as server:
        story = new_story(server, 8)
        first = generate(server, story)
        generate(server, new_story(server, 8, "Marek"))
        restored = generate(server, continuation(server, story, first))
        assert "disk cache tier off" in server.log()
    assert restored["tokens_cached"] >= len(story) + len(first["tokens"]) - 1


# The audit's damaged files: 10 bytes after the magic, and a header of 50,000 nested `[`
# (a struct.error and a RecursionError out of the index, before they were bounded).
DAMAGED = {
    "short": (MAGIC + b"\x10\x00", "truncated"),
    "nested": (MAGIC + (50_000).to_bytes(4, "little") + b"[" * 50_000, "bad header (nested)"),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_file_at_start_is_removed_and_the_server_serves(
    saved_story: Any, tmp_path: Path, damage: str
) -> None:
    """The model loads (no 503), the damaged file and a temporary file a killed writer
    left behind are gone, and the story is read again."""
    cache, story, first = saved_story
    path = saved_file(cache)
    content, reason = DAMAGED[damage]
    path.write_bytes(content)
    left = path.with_name(".killed-writer.tmp")
    left.write_bytes(content)
    answer, log = restart_and_continue(tmp_path, cache, story, first)
    assert f"removing {path.name}: {reason}" in log
    assert not path.exists() and not left.exists()
    assert answer["tokens_cached"] == 0 and len(answer["tokens"]) == 16


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_file_damaged_under_a_running_server_is_read_as_a_prompt(
    saved_story: Any, tmp_path: Path, damage: str
) -> None:
    """The file was indexed whole, then damaged: the request that would restore it reads
    its prompt (200, not 500), a stream running beside it ends as it should, the file is
    gone, and the next request with that prefix does not try it again."""
    cache, story, first = saved_story
    path = saved_file(cache)
    content, reason = DAMAGED[damage]
    with run_server(tmp_path, "--model", SMOLLM2, "--cache-dir", str(cache)) as server:
        assert server.metric('llama_srb_cache_tier_entries{tier="disk"}') == 1
        path.write_bytes(content)
        follow_up = continuation(server, story, first)
        body = {"prompt": new_story(server, title="Marek"), "n_predict": 64, "ignore_eos": True}
        body["stream"] = True
        with httpx.stream("POST", f"{server.base_url}/completion", json=body, timeout=300) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line)
            events = [json.loads(next(lines).removeprefix("data: "))]  # it is running
            answer = generate(server, follow_up)
            events += [json.loads(line.removeprefix("data: ")) for line in lines]
        again = generate(server, follow_up)
        assert server.metric("llama_srb_cache_tier_restore_failures_total") == 1
        assert server.metric('llama_srb_cache_tier_entries{tier="disk"}') == 0
        log = server.log()
    assert f"removing {path.name}: {reason}" in log and not path.exists()
    assert answer["tokens_cached"] == 0 and len(answer["tokens"]) == 16
    assert not any("error" in event for event in events)
    assert events[-1]["stop"] is True and events[-1]["stop_type"] == "limit"
    assert len(again["tokens"]) == 16

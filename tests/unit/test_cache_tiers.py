"""The prefix cache's lower tiers without a model: the tier store's budgets, index and
file checks (engine/tiers.py), and the engine saving evicted paths and restoring them over
the fake context, whose logits come from the cells each sequence holds (so a restore that
loads the wrong cells samples the wrong tokens)."""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from llama_srb.config import Settings
from llama_srb.engine.kv import KvBudget, as_tokens
from llama_srb.engine.tiers import (
    MAGIC,
    SUFFIX,
    DiskTier,
    Tier,
    TierStore,
    file_sha256,
)
from llama_srb.kv_types import KvType
from tests.unit.fake_context import BOS, check_kv, expected, make_engine, make_request, run

FINGERPRINT: dict[str, object] = {
    "model_sha256": "ab" * 32,
    "llama_cpp": "0.3.36",
    "kv_types": "f16/f16",
    "n_swa": 0,
}
_salt = iter(range(1, 10**6))


def story(length: int) -> list[int]:
    """Tokens no other story shares beyond its BOS."""
    salt = next(_salt)
    return [BOS, *[2 + (salt * 7 + i * (salt % 5 + 1)) % 26 for i in range(length - 1)]]


def disk(folder: Path, budget: int = 1 << 20, **fingerprint: object) -> DiskTier:
    return DiskTier(folder, {**FINGERPRINT, **fingerprint}, budget)


def state(tokens: list[int]) -> bytes:
    """Bytes as the fake context's state_get gives them."""
    return np.asarray(tokens, np.int32).tobytes()


# -- the store: budgets and what an entry serves ---------------------------------------------


def test_host_memory_keeps_the_most_recently_used_within_its_budget() -> None:
    store = TierStore(host_budget=250)
    a, b, c = story(25), story(25), story(25)  # 100 bytes each
    store.put(as_tokens(a), state(a))
    store.put(as_tokens(b), state(b))
    store.touch(store.entries[0])  # a is used again: b is now the oldest
    store.put(as_tokens(c), state(c))
    assert [list(e.tokens) for e in store.entries] == [a, c]
    assert store.counters.bytes_held[Tier.HOST] == 200 and store.counters.dropped == 1


def test_what_falls_out_of_host_memory_goes_to_disk_and_comes_back(tmp_path: Path) -> None:
    store = TierStore(host_budget=150, disk=disk(tmp_path))
    a, b = story(25), story(25)
    store.put(as_tokens(a), state(a))
    store.put(as_tokens(b), state(b))
    (on_disk,) = [e for e in store.entries if e.tier is Tier.DISK]
    assert list(on_disk.tokens) == a and on_disk.data is None
    assert on_disk.path is not None and on_disk.path.exists()
    assert store.load(on_disk) == state(a)


def test_the_disk_budget_removes_the_oldest_files(tmp_path: Path) -> None:
    store = TierStore(host_budget=0, disk=disk(tmp_path, budget=250))
    stories = [story(25) for _ in range(3)]
    for tokens in stories:
        store.put(as_tokens(tokens), state(tokens))
    assert [list(e.tokens) for e in store.entries] == stories[1:]
    assert len(list(tmp_path.glob("*" + SUFFIX))) == 2


def test_a_longer_path_replaces_its_prefix_unless_a_sliding_window_needs_both() -> None:
    short = story(40)
    long = [*short, 5, 6, 7]
    full = TierStore(host_budget=1 << 20)
    full.put(as_tokens(short), state(short))
    full.put(as_tokens(long), state(long))
    assert [list(e.tokens) for e in full.entries] == [long]
    full.put(as_tokens(short), state(short))  # served by the longer one already
    assert len(full.entries) == 1 and full.counters.saves == 2
    # With a sliding window an entry is exact only at its end: both stay.
    windowed = TierStore(host_budget=1 << 20, sliding_window=True)
    windowed.put(as_tokens(short), state(short))
    windowed.put(as_tokens(long), state(long))
    assert len(windowed.entries) == 2


def test_the_best_entry_respects_the_floor_the_limit_and_the_size() -> None:
    saved = story(60)
    prompt = as_tokens([*saved[:40], 9, 9])  # forks from inside the saved path
    full = TierStore(host_budget=1 << 20)
    full.put(as_tokens(saved), state(saved))
    assert full.best(prompt, limit=41, max_len=100)[1] == 40
    assert full.best(prompt, limit=30, max_len=100)[1] == 30
    assert full.best(prompt, limit=41, max_len=59) == (None, 0)  # it would not fit
    windowed = TierStore(host_budget=1 << 20, sliding_window=True)
    windowed.put(as_tokens(saved), state(saved))
    assert windowed.best(prompt, limit=41, max_len=100) == (None, 0)
    extended = as_tokens([*saved, 3])
    assert windowed.best(extended, limit=60, max_len=100)[1] == 60
    assert windowed.best(as_tokens(saved), limit=59, max_len=100)[1] == 59  # all but the last


# -- the disk tier: an index that trusts nothing ---------------------------------------------


def test_a_restart_indexes_the_folder_oldest_first(tmp_path: Path) -> None:
    first = TierStore(host_budget=1 << 20, disk=disk(tmp_path))
    stories = [story(30), story(30)]
    for tokens in stories:
        first.put(as_tokens(tokens), state(tokens))
    first.flush()
    assert all(e.tier is Tier.DISK for e in first.entries)
    again = TierStore(host_budget=1 << 20, disk=disk(tmp_path))
    assert sorted(map(list, (e.tokens for e in again.entries))) == sorted(stories)
    entry = next(e for e in again.entries if list(e.tokens) == stories[1])
    assert again.load(entry) == state(stories[1])


def saved_file(tmp_path: Path, tokens: list[int]) -> Path:
    store = TierStore(host_budget=0, disk=disk(tmp_path))
    store.put(as_tokens(tokens), state(tokens))
    (path,) = tmp_path.glob("*" + SUFFIX)
    return path


def rewrite_header(path: Path, **changes: object) -> None:
    data = path.read_bytes()
    start = len(MAGIC) + 4
    length = int.from_bytes(data[len(MAGIC) : start], "little")
    header = {**json.loads(data[start : start + length]), **changes}
    encoded = json.dumps(header).encode()
    path.write_bytes(
        data[: len(MAGIC)] + len(encoded).to_bytes(4, "little") + encoded + data[start + length :]
    )


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-1]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes() + b"\0"), "truncated"),
        (lambda p: p.write_bytes(b"GGUF" + p.read_bytes()[4:]), "not a llama-srb KV file"),
        (lambda p: p.write_bytes(p.read_bytes()[:5]), "not a llama-srb KV file"),
        (lambda p: rewrite_header(p, llama_cpp="0.3.1"), "llama_cpp differ"),
        (lambda p: rewrite_header(p, model_sha256="cd" * 32), "model_sha256 differ"),
        (lambda p: rewrite_header(p, kv_types="q8_0/q8_0"), "kv_types differ"),
        (lambda p: rewrite_header(p, n_tokens="many"), "bad header"),
    ],
)
def test_a_damaged_or_foreign_file_is_removed_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, reason: str
) -> None:
    path = saved_file(tmp_path, story(30))
    damage(path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING):
        store = TierStore(host_budget=0, disk=disk(tmp_path))
    assert store.entries == [] and not path.exists()
    assert reason in caplog.text


def with_header(path: Path, header: bytes, length: int | None = None) -> None:
    """The file with `header` in place of its own (and `length` for it, if given)."""
    data = path.read_bytes()
    start = len(MAGIC) + 4
    old = int.from_bytes(data[len(MAGIC) : start], "little")
    claimed = len(header) if length is None else length
    path.write_bytes(MAGIC + claimed.to_bytes(4, "little") + header + data[start + old :])


# Each damaged form of a file (the audit's first two), and the reason logged for it.
DAMAGED = [
    pytest.param(lambda p: p.write_bytes(MAGIC + b"\x10\x00"), "truncated", id="short-after-magic"),
    pytest.param(lambda p: with_header(p, b"[" * 50_000), "nested", id="nested-50000"),
    pytest.param(
        lambda p: with_header(p, b"{}", length=0xFFFFFFFF), "header length", id="huge-length"
    ),
    pytest.param(
        lambda p: with_header(p, b'{"a": 1}', length=60_000), "header length", id="length-past-end"
    ),
    pytest.param(lambda p: with_header(p, b'{"a": "\xff"}'), "bad header", id="not-utf8"),
    pytest.param(lambda p: with_header(p, b"[1, 2]"), "not a flat object", id="not-an-object"),
    pytest.param(lambda p: rewrite_header(p, n_tokens=True), "bad header", id="bool-count"),
    pytest.param(lambda p: rewrite_header(p, n_tokens=-3), "bad header", id="negative-count"),
    pytest.param(lambda p: rewrite_header(p, payload_bytes=None), "bad header", id="null-size"),
    pytest.param(lambda p: rewrite_header(p, n_tokens=10**40), "budget", id="huge-count"),
    pytest.param(lambda p: rewrite_header(p, checksum=[1, 2]), "flat object", id="list-value"),
    pytest.param(lambda p: rewrite_header(p, n_swa={"a": 0}), "flat object", id="object-value"),
    pytest.param(lambda p: p.write_bytes(p.read_bytes()[:-50]), "truncated", id="truncated-body"),
    pytest.param(
        lambda p: p.write_bytes(p.read_bytes()[: len(MAGIC) + 30]),
        "header length",
        id="cut-in-header",
    ),
]


@pytest.mark.parametrize(("damage", "reason"), DAMAGED)
def test_a_damaged_file_is_removed_at_start_never_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, reason: str
) -> None:
    keep = story(30)
    kept = saved_file(tmp_path / "kept", keep)
    os.replace(kept, tmp_path / kept.name)  # a valid file beside the damaged one
    path = saved_file(tmp_path / "damaged", story(30))
    damage(path)  # type: ignore[operator]
    os.replace(path, tmp_path / path.name)
    path = tmp_path / path.name
    with caplog.at_level(logging.WARNING):
        store = TierStore(host_budget=0, disk=disk(tmp_path))
    assert not path.exists() and reason in caplog.text and path.name in caplog.text
    (entry,) = store.entries  # the valid file is served
    assert list(entry.tokens) == keep and store.load(entry) == state(keep)


@pytest.mark.parametrize(("damage", "reason"), DAMAGED)
def test_a_file_damaged_after_it_was_indexed_is_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, reason: str
) -> None:
    """Damaged under a running server: the load is a miss (its request reads the prompt),
    the entry and the file are gone, and the next load is not tried again."""
    path = saved_file(tmp_path, story(30))
    store = TierStore(host_budget=0, disk=disk(tmp_path))
    (entry,) = store.entries
    damage(path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING):
        assert store.load(entry) is None
    assert reason in caplog.text and path.name in caplog.text
    assert store.entries == [] and not path.exists()
    assert store.counters.entries[Tier.DISK] == 0 and store.counters.bytes_held[Tier.DISK] == 0


def test_a_file_replaced_by_another_entry_is_a_miss(tmp_path: Path) -> None:
    """Valid, but not the entry indexed under its name (another size or other tokens)."""
    tokens = story(30)
    path = saved_file(tmp_path, tokens)
    store = TierStore(host_budget=0, disk=disk(tmp_path))
    other = saved_file(tmp_path / "other", story(40))
    os.replace(other, path)
    assert store.load(store.entries[0]) is None and not path.exists()


def test_a_corrupted_payload_is_caught_when_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = story(30)
    path = saved_file(tmp_path, tokens)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x01
    path.write_bytes(bytes(data))
    store = TierStore(host_budget=0, disk=disk(tmp_path))
    (entry,) = store.entries  # the header is fine: indexed
    with caplog.at_level(logging.WARNING):
        assert store.load(entry) is None
    assert "checksum mismatch" in caplog.text
    assert store.entries == [] and not path.exists()


def test_a_file_removed_by_another_process_is_a_miss(tmp_path: Path) -> None:
    path = saved_file(tmp_path, story(30))
    store = TierStore(host_budget=0, disk=disk(tmp_path))
    path.unlink()  # the other replica's budget dropped it
    assert store.load(store.entries[0]) is None and store.entries == []


def test_a_half_written_file_is_never_read(tmp_path: Path) -> None:
    """A writer that died mid-write (kill -9) or is still writing in another process
    leaves a temporary name, which the index does not read. The dead writer's goes at
    the next start (it would hold disk outside the budget); the live one holds a lock."""
    tokens = story(30)
    path = saved_file(tmp_path, tokens)
    writing, dead = tmp_path / ".writing.tmp", tmp_path / ".dead.tmp"
    for partial in (writing, dead):
        partial.write_bytes(path.read_bytes()[:40])
    with writing.open("rb") as live:
        fcntl.flock(live, fcntl.LOCK_EX)  # as DiskTier.write holds it until the rename
        store = TierStore(host_budget=0, disk=disk(tmp_path))
    assert [list(e.tokens) for e in store.entries] == [tokens]
    assert writing.exists() and not dead.exists()  # the dead writer's is swept
    TierStore(host_budget=0, disk=disk(tmp_path))  # its writer is gone now too
    assert not writing.exists()


def test_a_disk_that_refuses_writes_turns_the_tier_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "kv"
    store = TierStore(host_budget=150, disk=disk(folder))
    folder.rmdir()
    folder.write_text("")  # every write in it now fails (as a full or read-only disk)
    a, b = story(25), story(25)
    with caplog.at_level(logging.WARNING):
        store.put(as_tokens(a), state(a))
        store.put(as_tokens(b), state(b))  # a goes down to disk, which fails
    assert store.disk is not None and not store.disk.enabled
    assert "disk cache tier off" in caplog.text
    assert [list(e.tokens) for e in store.entries] == [b]  # host memory goes on
    assert not list(tmp_path.glob("**/*.tmp"))


def test_the_model_checksum_is_computed_once(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    stamps = tmp_path / "stamps"
    first = file_sha256(model, stamps)
    (stamp,) = stamps.iterdir()
    stamp.write_text("f" * 64)  # a later start reads the stamp, not the file
    assert file_sha256(model, stamps) == "f" * 64
    model.write_bytes(b"other weights")  # another file: another key
    assert file_sha256(model, stamps) not in (first, "f" * 64)


def test_a_file_of_other_kv_types_is_never_restored(tmp_path: Path) -> None:
    """Each pair of KV types has a folder of its own under the model's, named in the header
    too: a q8_0 server sees none of the f16 stories and leaves them for an f16 server
    again; a file moved into another pair's folder is refused (and removed) there."""
    from llama_srb.loader import disk_tier  # imports llama.cpp's binding

    def tiers(k: KvType, v: KvType) -> TierStore:
        settings = Settings(cache_dir=tmp_path, cache_type_k=k, cache_type_v=v)
        return TierStore(host_budget=0, disk=disk_tier(settings, "ab" * 32, n_swa=0))

    saved = story(30)
    f16 = tiers(KvType.f16, KvType.f16)
    f16.put(as_tokens(saved), state(saved))
    assert f16.disk is not None and f16.disk.folder == tmp_path / ("ab" * 8)  # as before
    assert f16.disk.fingerprint["kv_types"] == "f16/f16"
    q8 = tiers(KvType.q8_0, KvType.q8_0)
    assert q8.disk is not None and q8.disk.folder.name == "ab" * 8 + "-q8_0-q8_0"
    assert q8.entries == []
    assert [list(e.tokens) for e in tiers(KvType.f16, KvType.f16).entries] == [saved]
    mixed = tiers(KvType.q8_0, KvType.f16)  # the pair, not each type: a folder of its own
    assert mixed.disk is not None and mixed.disk.folder != q8.disk.folder
    (path,) = (tmp_path / ("ab" * 8)).glob("*" + SUFFIX)
    moved = q8.disk.folder / path.name
    os.replace(path, moved)
    assert tiers(KvType.q8_0, KvType.q8_0).entries == [] and not moved.exists()


# -- the engine: evicted paths go down a tier and come back ----------------------------------


def two_stories_engine(store: TierStore, n_ctx: int = 100):  # type: ignore[no-untyped-def]
    """An engine with room for one 60-cell story at a time."""
    return make_engine(n_ctx=n_ctx, n_batch=16, tiers=store)


def test_an_evicted_story_is_restored_and_continues_as_if_it_had_stayed() -> None:
    store = TierStore(host_budget=1 << 20)
    engine, ctx = two_stories_engine(store)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(50), max_tokens=6))  # evicts the first story
    run(engine, out)
    assert store.counters.saves == 1 and len(store.entries) == 1
    path = first + out.tokens("a")[0][:5]  # the cells it held (the 6th was never decoded)
    follow_up = [*path, 7, 8]
    decoded = ctx.decoded
    engine.add(make_request("c", follow_up, max_tokens=6))
    run(engine, out)
    assert out.tokens("c")[0] == expected(follow_up, 0, 6)  # from the restored cells
    assert out.last("c").cached_tokens == len(path)
    assert ctx.decoded - decoded == len(follow_up) - len(path) + 5
    assert engine.stats.tier_hits == {"host": 1}
    assert engine.stats.tier_tokens_restored == {"host": len(path)}


def test_a_restore_that_fails_reads_the_prompt_instead() -> None:
    store = TierStore(host_budget=1 << 20)
    engine, ctx = two_stories_engine(store)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(50), max_tokens=6))
    run(engine, out)
    ctx.refuse_state = True  # llama.cpp refuses the bytes (another layout, no room)
    follow_up = [*first, *out.tokens("a")[0][:5], 7]
    engine.add(make_request("c", follow_up, max_tokens=4))
    run(engine, out)
    assert out.tokens("c")[0] == expected(follow_up, 0, 4)
    assert out.last("c").cached_tokens == 0
    assert engine.stats.tier_restore_failures == 1 and engine.stats.tier_hits == {}
    # Dropped (it would be refused again); what is there now is the second story, which
    # the third pushed out.
    assert all(list(e.tokens[:50]) != first for e in store.entries)


def test_a_damaged_disk_file_under_a_running_engine_reads_the_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file damaged after the index took it in: its request reads the prompt, the
    request admitted beside it is untouched, and nothing fails."""
    store = TierStore(host_budget=0, disk=disk(tmp_path))
    engine, _ = two_stories_engine(store)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(50), max_tokens=6))  # the first goes to disk
    run(engine, out)
    (path,) = tmp_path.glob("*" + SUFFIX)
    path.write_bytes(MAGIC + b"\x10\x00")  # the audit's: 10 bytes after the magic
    follow_up, other = [*first, *out.tokens("a")[0][:5], 7], story(20)
    engine.add(make_request("c", follow_up, max_tokens=4))
    engine.add(make_request("d", other, max_tokens=4))
    with caplog.at_level(logging.WARNING):
        run(engine, out)
    assert out.tokens("c")[0] == expected(follow_up, 0, 4) and out.last("c").cached_tokens == 0
    assert out.tokens("d")[0] == expected(other, 0, 4)
    assert out.reasons("c") == out.reasons("d") == {0: "length"}
    assert engine.stats.tier_restore_failures == 1 and not path.exists()
    assert f"removing {path.name}: truncated" in caplog.text


def test_a_fork_from_inside_a_windowed_entry_reads_again() -> None:
    """Sliding-window models: an entry is exact at its end only (the answer's, and the
    prompt's saved beside it)."""
    store = TierStore(host_budget=1 << 20, sliding_window=True)
    engine, _ = two_stories_engine(store)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(50), max_tokens=6))
    run(engine, out)
    fork = [*first[:20], 9, 9]  # inside the prompt: nothing ends there
    engine.add(make_request("c", fork, max_tokens=4))
    run(engine, out)
    assert out.tokens("c")[0] == expected(fork, 0, 4)
    assert out.last("c").cached_tokens == 0 and engine.stats.tier_hits == {}
    new_ending = [*first, 9, 9]  # after the whole prompt: its entry serves it
    engine.add(make_request("d", new_ending, max_tokens=4))
    run(engine, out)
    assert out.tokens("d")[0] == expected(new_ending, 0, 4)
    assert out.last("d").cached_tokens == len(first) and engine.stats.tier_hits == {"host": 1}


def test_restored_cells_are_not_forked_from_below_their_floor() -> None:
    """A windowed path restored and parked again: a later prompt sharing only its start
    computes it (cells below the floor lack the window's layers) while the books stay
    exact (check_kv after every step)."""
    store = TierStore(host_budget=1 << 20, sliding_window=True)
    engine, _ = make_engine(n_ctx=200, n_batch=16, tiers=store, cache_cells=120)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(70), max_tokens=6))  # evicts the first story
    run(engine, out)
    follow_up = [*first, *out.tokens("a")[0][:5], 7]
    engine.add(make_request("c", follow_up, max_tokens=4))
    run(engine, out)
    assert engine.stats.tier_hits == {"host": 1}
    (restored,) = [p for p in engine.scheduler.budget.cache.paths if p.floor]
    assert restored.floor == len(first) + 5 - 1
    fork = [*first[:40], 9, 9]  # shares 40 tokens with the restored path: below its floor
    engine.add(make_request("d", fork, max_tokens=4))
    run(engine, out)
    assert out.tokens("d")[0] == expected(fork, 0, 4)
    assert out.last("d").cached_tokens == 0
    check_kv(engine)


def test_at_shutdown_every_cached_path_is_written_to_disk(tmp_path: Path) -> None:
    store = TierStore(host_budget=1 << 20, disk=disk(tmp_path))
    engine, _ = make_engine(n_ctx=400, n_batch=16, tiers=store)
    stories = [story(40), story(40)]
    for i, tokens in enumerate(stories):
        engine.add(make_request(f"s{i}", tokens, max_tokens=3))
    run(engine)
    assert store.entries == []  # both still live
    engine.save_cache()
    assert len(list(tmp_path.glob("*" + SUFFIX))) == 2
    again = TierStore(host_budget=0, disk=disk(tmp_path))
    assert sorted(len(e) for e in again.entries) == [42, 42]


def test_no_tiers_without_a_prefix_cache() -> None:
    budget = KvBudget(4, 100, cache_paths=4, cache_cells=0, tiers=TierStore(1 << 20))
    assert budget.tiers is None and not budget.cache.save_evicted


def test_a_swipe_on_an_evicted_windowed_story_restores_its_prompt() -> None:
    """Two branches of one prompt, evicted: with a sliding window each is exact only at
    its end, so an entry that ends with their prompt is saved too; the same prompt
    again (a swipe) restores it."""
    store = TierStore(host_budget=1 << 20, sliding_window=True)
    engine, _ = two_stories_engine(store)
    first = story(50)
    engine.add(make_request("a", first, n=2, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(50), max_tokens=6))  # evicts both branches
    run(engine, out)
    assert sorted(len(e) for e in store.entries) == [50, 55, 55]
    engine.add(make_request("c", first, n=2, max_tokens=6))
    run(engine, out)
    assert out.tokens("c") == out.tokens("a")
    assert out.last("c").cached_tokens == len(first) - 1  # the last is decoded again
    assert engine.stats.tier_hits == {"host": 1}


@pytest.mark.parametrize("refused", [False, True])
def test_two_requests_for_one_restored_story_share_it_or_both_read_it(refused: bool) -> None:
    """The second waits for the first's restore (whose cells arrive in the step that
    admits them both) rather than copy cells that are not there yet."""
    store = TierStore(host_budget=1 << 20)
    engine, ctx = make_engine(n_ctx=160, n_batch=16, tiers=store, cache_cells=70)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    engine.add(make_request("b", story(50), max_tokens=6))
    run(engine, out)
    ctx.refuse_state = refused
    follow_up = [*first, *out.tokens("a")[0][:5], 7, 8]
    engine.add(make_request("c", follow_up, max_tokens=4))
    engine.add(make_request("d", follow_up, max_tokens=4))
    run(engine, out)
    assert out.tokens("c")[0] == out.tokens("d")[0] == expected(follow_up, 0, 4)
    assert engine.stats.tier_hits == ({} if refused else {"host": 1})
    assert out.last("d").cached_tokens == len(follow_up) - 1  # from c, once c has it


def test_a_path_longer_than_the_idle_cells_goes_straight_down_a_tier() -> None:
    """--cache-cells below a story's length: it cannot stay in the live cells, but it is
    saved rather than dropped, and comes back."""
    store = TierStore(host_budget=1 << 20)
    engine, ctx = make_engine(n_ctx=200, n_batch=16, tiers=store, cache_cells=30)
    first = story(50)
    engine.add(make_request("a", first, max_tokens=6))
    out = run(engine)
    assert engine.scheduler.budget.cache.paths == [] and not ctx.cells
    follow_up = [*first, *out.tokens("a")[0][:5], 7]
    engine.add(make_request("b", follow_up, max_tokens=4))
    run(engine, out)
    assert out.tokens("b")[0] == expected(follow_up, 0, 4)
    assert out.last("b").cached_tokens == len(follow_up) - 1


def test_the_tier_settings_and_their_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_srb.cli import add_settings_flags, settings_from_args  # imports the API

    defaults = Settings()
    assert defaults.cache_ram_bytes(available=16 << 30) == 4 << 30  # a quarter
    assert defaults.cache_ram_bytes(available=64 << 30) == 8 << 30  # at most 8 GiB
    assert defaults.cache_ram_bytes(available=None) == 0  # unknown: none
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert defaults.cache_folder() == tmp_path / "llama-srb" / "kv"
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    flags = ["--cache-ram", "64", "--cache-disk", "0", "--cache-dir", str(tmp_path / "d")]
    settings = settings_from_args(parser.parse_args(flags))
    assert settings.cache_ram_bytes(available=16 << 30) == 64 << 20
    assert settings.cache_disk == 0 and settings.cache_folder() == tmp_path / "d"
    with pytest.raises(ValueError):
        Settings(cache_ram=-1)

"""Backend sampling over the fake context (engine/device_cut.py, sampling/device_row.py):
rows read as the device's top-K candidates give every branch the token its whole row
gives, or say they cannot (then the whole row is read: the call's copy, or the row decoded
again on the scratch sequence); a call with rows that need whole rows gets them; the KV
books hold after every step, the scratch sequence included."""

from __future__ import annotations

import numpy as np
import pytest

from llama_srb.config import MAX_SEQUENCE_IDS, Settings
from llama_srb.engine.device_cut import DEVICE_TOP_K
from llama_srb.engine.engine import Engine
from llama_srb.loader import backend_sampling, context_options, kv_budget, offloaded
from llama_srb.sampling import _rows
from llama_srb.sampling.cut import Row, most_likely_first
from llama_srb.sampling.device_row import DeviceRow, Undecided, sort_candidates
from tests.unit.fake_context import (
    BOS,
    N_VOCAB,
    Ends,
    FakeContext,
    FakeSampler,
    Outputs,
    make_engine,
    make_request,
    run,
)

K = 6
PROMPT = [BOS, 5, 9, 3, 14, 7, 2]


def top(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A device's top-k of `row`, in no particular order (here: least likely first)."""
    ids = np.argsort(-row, kind="stable")[:k][::-1].astype(np.int32)
    return ids, row[ids]


@pytest.mark.parametrize("seed", range(40))
def test_a_device_row_picks_what_the_whole_row_picks_or_says_it_cannot(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_vocab, k_device = 512, 16
    # rounded logits: ties happen, at the cut and inside it
    logits = np.round(rng.normal(0, 2, n_vocab), 1).astype(np.float32)
    masked = np.unique(rng.choice(np.argsort(-logits)[:20], rng.integers(0, 12)))
    for k in range(1, k_device + 2):
        device = DeviceRow(*top(logits, k_device))
        host = Row(logits.copy())
        device.patch(masked, np.full(len(masked), -np.inf, np.float32))
        host.patch(masked, np.full(len(masked), -np.inf, np.float32))
        try:
            ids, values, *_ = device.top_k(k)
        except Undecided:
            # only when the k-th survivor is not above the K-th candidate, or ties the next
            head = np.sort(host.logits)[::-1][: k + 1]
            assert head[k - 1] <= logits[top(logits, k_device)[0]].min() or head[k - 1] == head[k]
        else:
            # the host path's top-k cut: equals lowest id first (BranchSampler._cut)
            host_ids, host_values, *_ = host.top_k(k)
            by_id = np.argsort(host_ids)
            want_ids, want_values = most_likely_first(host_ids[by_id], host_values[by_id])
            assert ids.tolist() == want_ids.tolist()
            assert values.tolist() == want_values.tolist()
        try:
            assert device.argmax() == host.argmax()
        except Undecided:
            assert host.max <= logits[top(logits, k_device)[0]].min()
        device.restore()
        host.restore()


@pytest.mark.parametrize("seed", range(20))
def test_a_device_row_keeps_what_a_min_p_keeps_of_the_whole_row_or_says_it_cannot(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(0, 2, 512), 1).astype(np.float32)
    masked = np.unique(rng.choice(np.argsort(-logits)[:20], rng.integers(0, 12)))
    floor = logits[top(logits, 16)[0]].min()
    decided = 0
    for gap in np.linspace(0.1, 8.0, 40):
        device = DeviceRow(*top(logits, 16))
        host = Row(logits.copy())
        device.patch(masked, np.full(len(masked), -np.inf, np.float32))
        host.patch(masked, np.full(len(masked), -np.inf, np.float32))
        threshold = host.max - float(gap)
        try:
            ids, values = device.at_least(device.max - float(gap))
        except Undecided:  # only when a token off the list could reach the threshold
            assert floor >= np.float32(threshold)
        else:
            decided += 1
            want_ids, want_values = most_likely_first(*host.tokens_at_least(threshold))
            assert ids.tolist() == want_ids.tolist()
            assert values.tolist() == want_values.tolist()
        device.restore()
        host.restore()
    assert decided > 0


def test_a_device_row_without_masks_or_ties_decides_every_cut_below_k() -> None:
    logits = -np.arange(64, dtype=np.float32)[np.random.default_rng(1).permutation(64)]
    device = DeviceRow(*top(logits, 10))
    for k in range(1, 10):
        assert device.top_k(k).ids.tolist() == np.argsort(-logits)[:k].tolist()
    with pytest.raises(Undecided):  # the 10th could tie a token off the list
        device.top_k(10)
    assert DeviceRow(*top(logits, 64), complete=True).top_k(64).ids[-1] == np.argmin(logits)


def test_a_row_patched_again_with_the_same_mask_reads_as_patched_once() -> None:
    """A prompt's last row serves every branch its first token, each masking end of
    generation with the same arrays: the second patch reuses the first's row, and a
    patch with other ids is made afresh."""
    logits = np.round(np.random.default_rng(3).normal(0, 2, 256), 1).astype(np.float32)
    row = DeviceRow(*top(logits, 16))
    ids = np.sort(row.ids[:2])
    other = np.sort(row.ids[2:4])
    minus = np.full(2, -np.inf, np.float32)
    seen = []
    for mask in (ids, ids, other, ids):
        row.patch(mask, minus)
        seen.append((row.ids.tolist(), row.values.tolist()))
        fresh = DeviceRow(*top(logits, 16))
        fresh.patch(mask.copy(), minus.copy())
        assert seen[-1] == (fresh.ids.tolist(), fresh.values.tolist())
        row.restore()
    row.patch(ids, minus)
    patched = row.ids
    row.restore()
    row.patch(ids, minus)
    assert row.ids is patched  # the last patch's row, not a new one
    row.restore()
    assert set(row.ids[:4].tolist()) == set(ids.tolist() + other.tolist())  # restored


@pytest.mark.parametrize("seed", range(5))
def test_a_call_s_candidates_are_sorted_as_the_host_path_reads_a_cut(seed: int) -> None:
    """Most likely first, lower ids first among equals, -0.0 equal to 0.0, -inf last;
    from any order (llama.cpp's CPU top_k swaps the first two; a GPU's may be any); and
    which rows hold a marked id (end of generation)."""
    rng = np.random.default_rng(seed)
    values = np.round(rng.normal(0, 2, (8, 64)), 1).astype(np.float32)  # ties
    values[0, :3] = [-0.0, 0.0, -np.inf]
    values[1] = 0.0
    ids = np.stack([rng.permutation(262_144)[:64] for _ in range(8)]).astype(np.int32)
    values[2, :2], ids[2, :2] = values[2, 1::-1], ids[2, 1::-1]
    marked = np.array([ids[3, 17], ids[5, 0]], np.int64)
    got_ids, got_values, holds = sort_candidates(ids, values, marked)
    assert holds.tolist() == [np.isin(marked, row).any() for row in ids]
    assert holds.tolist().count(True) >= 2
    for row in range(8):
        order = np.lexsort((ids[row], -values[row]))
        assert got_ids[row].tolist() == ids[row][order].tolist()
        assert got_values[row].tolist() == values[row][order].tolist()
    assert got_ids.dtype == np.int64 and got_values.dtype == np.float32
    # read where llama.cpp leaves them (DeviceCut.read): rows of a buffer, the first k of each
    rows = [6, 1, 3]
    some_ids, some_values = np.empty((3, 40), np.int64), np.empty((3, 40), np.float32)
    some_holds = np.empty(3, np.bool_)
    _rows.sort_candidates(ids, values, 64, rows, 40, marked, some_ids, some_values, some_holds)
    for at, row in enumerate(rows):
        order = np.lexsort((ids[row, :40], -values[row, :40]))
        assert some_ids[at].tolist() == ids[row, :40][order].tolist()
        assert some_values[at].tolist() == values[row, :40][order].tolist()
    assert some_holds.tolist() == [np.isin(marked, ids[row, :40]).any() for row in rows]
    # the C loop checks its shapes and rows
    out = (np.empty((1, 64), np.int64), np.empty((1, 64), np.float32), np.empty(1, np.bool_))
    for stride, at, k, refusal in (
        (5, 0, 5, "row length"),
        (64, 0, 65, "row length"),
        (64, 8, 64, "rows"),
        (64, -1, 64, "rows"),
        (64, 0, 32, "shaped"),
    ):
        with pytest.raises(ValueError, match=refusal):
            _rows.sort_candidates(ids, values, stride, [at], k, marked, *out)


def test_the_pick_loop_refuses_misshapen_candidates_and_reads_the_work_it_was_given() -> None:
    # one row of 4 candidates, sorted as DeviceCut.read leaves them
    ids, values = np.array([7, 5, 2, 0]), np.array([3, 2, 1, 0], np.float32)
    holds, eog = np.zeros(1, np.bool_), np.empty(0, np.int64)
    greedy = (0, 0, 1, 1.0, 0.0)  # (chain, kind, top_k, scale, log_min_p): needs no chain

    def pick(k: int, work: list[object]) -> list[int | None]:
        picked: list[int | None] = _rows.pick_candidates(
            ids, values, k, holds, eog, False, 0, 0, work
        )
        return picked

    assert pick(4, [(0, False, greedy)]) == [7]
    # k must make len(ids) one row: 2**62 + 1 makes 4 of them in 64-bit arithmetic
    for k in (0, -1, 2, 2**62 + 1):
        with pytest.raises(ValueError, match="not k candidates a row"):
            pick(k, [(0, False, greedy)])

    class Slot:  # its conversion to an index empties the list being read
        def __index__(self) -> int:
            work.clear()
            return 0

    work: list[object] = [(Slot(), False, greedy), (0, False, greedy)]
    assert pick(4, work) == [7, 7]  # what it was called with


def test_only_rows_holding_end_of_generation_are_masked_and_all_pick_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ignore_eos the engine masks the model's end-of-generation tokens. A row whose
    candidates hold none of them (DeviceCut checks a call's rows at once) is not
    patched, as the mask changes nothing there; one that holds one is. Every branch
    draws what its masked whole row gives it (the table puts EOS first after 3 tokens)."""
    requests = [("a", PROMPT, 3, {"max_tokens": 9, "ignore_eos": True})]
    table = Ends(len(PROMPT), 3)
    host, _ = make_engine(max_live=8, table=table)
    device, _ = make_engine(max_live=8, table=table, device_top_k=K, chained=8)
    patched: list[bool] = []
    patch = DeviceRow.patch

    def counted(row: DeviceRow, ids: np.ndarray, values: np.ndarray) -> None:
        patched.append(bool(np.isin(ids, row.ids).any()))
        patch(row, ids, values)

    monkeypatch.setattr(DeviceRow, "patch", counted)
    assert outputs_of(device, requests) == outputs_of(host, requests)
    rows = device.stats.device_rows
    assert 0 < len(patched) < rows and all(patched)  # some rows held EOS; only they


def outputs_of(engine: Engine, requests: list[tuple[str, list[int], int, dict[str, object]]]):
    for name, prompt, n, params in requests:
        engine.add(make_request(name, prompt, n, **params))
    got = run(engine)
    return {name: got.tokens(name) for name, *_ in requests}


REQUESTS = [
    ("a", PROMPT, 3, {"max_tokens": 9}),
    ("b", [BOS, 4, 4, 8], 2, {"max_tokens": 5}),
]


def test_the_device_path_gives_every_branch_its_host_path_tokens() -> None:
    host, _ = make_engine(max_live=8)
    device, ctx = make_engine(max_live=8, device_top_k=K, chained=8)
    assert outputs_of(device, REQUESTS) == outputs_of(host, REQUESTS)
    stats = device.stats
    assert stats.device_rows > 0 and stats.device_undecided == 0
    assert ctx.whole_decodes == 0  # no row needed its whole row: none was copied out
    # the host read each row's candidates, 8 bytes each, not a row of the vocabulary
    assert stats.logits_bytes_read == stats.device_rows * K * 8
    assert host.stats.logits_bytes_read > stats.logits_bytes_read


@pytest.mark.parametrize("chained", [8, 16])
def test_a_row_that_needs_its_whole_row_makes_the_call_copy_them(chained: int) -> None:
    """With 8 ids chained, the request that needs whole rows gets ids without a chain;
    with all 16, it cannot, and the scratch sequence's token makes the calls whole."""
    host, _ = make_engine(max_live=8)
    device, ctx = make_engine(max_live=8, device_top_k=K, chained=chained)
    expected = outputs_of(host, [*REQUESTS, ("c", [BOS, 3, 3], 2, {"max_tokens": 6})])
    for name, prompt, n, params in REQUESTS:
        device.add(make_request(name, prompt, n, **params))
    whole = make_request("c", [BOS, 3, 3], 2, max_tokens=6)
    for branch in whole.branches:  # a chain no device top-k decides
        assert isinstance(branch.sampler, FakeSampler)
        branch.sampler.device_k = None
    device.add(whole)
    got = run(device)
    assert {name: got.tokens(name) for name in expected} == expected
    assert ctx.whole_decodes > 0 and device.stats.device_rows > 0
    assert device.device is not None
    assert (device.device.scratch in ctx.seqs_decoded) == (chained == 16)


def test_a_request_s_ids_carry_the_cut_when_it_serves_it() -> None:
    engine, _ = make_engine(max_live=6, cache_paths=2, device_top_k=K, chained=3)
    served = make_request("on", PROMPT, 2, max_tokens=3)
    other = make_request("off", [BOS, 3, 3], 2, max_tokens=3)
    for branch in other.branches:
        assert isinstance(branch.sampler, FakeSampler)
        branch.sampler.device_k = None
    engine.add(other)
    engine.add(served)
    engine.step()
    assert all(b.seq_id < 3 for b in served.branches)
    assert all(b.seq_id >= 3 for b in other.branches)
    run(engine)


def test_parked_paths_leave_the_ids_that_carry_the_cut_to_the_next_request() -> None:
    """A request's ended branches are parked on ids without the cut (their cells copied
    over), so the next request of as many branches as ids carry it gets them all: none of
    its calls copies whole rows, and it still reads its prompt from the parked paths."""
    host, _ = make_engine(max_live=8, cache_paths=8)
    device, ctx = make_engine(max_live=8, cache_paths=8, device_top_k=K, chained=5)
    first = [("a", PROMPT, 4, {"max_tokens": 5})]
    assert outputs_of(device, first) == outputs_of(host, first)
    budget = device.scheduler.budget
    assert all(path.seq_id >= 5 for path in budget.cache.paths)
    copied = ctx.whole_decodes
    again = make_request("b", [*PROMPT, 3, 8], 5, max_tokens=5)
    ctx.seqs_decoded.clear()
    device.add(again)
    got = run(device)
    assert ctx.seqs_decoded == {0, 1, 2, 3, 4}  # the ids that carry the cut, and only they
    assert ctx.whole_decodes == copied
    assert device.stats.prompt_tokens_cached >= len(PROMPT) - 1
    host.add(make_request("b", [*PROMPT, 3, 8], 5, max_tokens=5))
    assert got.tokens("b") == run(host).tokens("b")


def test_a_request_it_serves_takes_back_the_ids_that_carry_the_cut_from_parked_paths() -> None:
    """A host-path request that found no other ids free ran on some that carry the cut,
    and its paths stayed parked there. The next request the cut serves moves them to ids
    without it (their cells copied over, the cache still whole) instead of taking ids
    without the cut: none of its calls copies whole rows, and it still forks its prompt
    from the parked paths. (Seen from outside: SillyTavern's Default preset, then its
    Universal-Light, read every row whole at n = 8.)"""
    host, _ = make_engine(max_live=8, cache_paths=2)
    device, ctx = make_engine(max_live=8, cache_paths=2, device_top_k=K, chained=4)
    hosted = make_request("off", PROMPT, 8, max_tokens=4)
    for branch in hosted.branches:  # a chain the cut cannot decide (a top-p first, say)
        assert isinstance(branch.sampler, FakeSampler)
        branch.sampler.device_k = None
    device.add(hosted)
    run(device)
    budget = device.scheduler.budget
    assert any(path.seq_id < 4 for path in budget.cache.paths)  # no other id was free
    copied = ctx.whole_decodes
    served = make_request("on", [*PROMPT, 3, 8], 4, max_tokens=5)
    ctx.seqs_decoded.clear()
    device.add(served)
    got = Outputs()
    got.add(device.step())
    assert sorted(b.seq_id for b in served.branches) == [0, 1, 2, 3]
    run(device, got)
    assert ctx.whole_decodes == copied
    assert ctx.seqs_decoded <= {0, 1, 2, 3}
    assert device.stats.prompt_tokens_cached >= len(PROMPT) - 1
    host.add(make_request("on", [*PROMPT, 3, 8], 4, max_tokens=5))
    assert got.tokens("on") == run(host).tokens("on")


def test_a_pick_the_candidates_cannot_prove_reads_the_row_decoded_again() -> None:
    """End-of-generation leads after two tokens but is masked (min_tokens): with K = 2,
    the one candidate left is the K-th itself, which a token off the list could tie."""
    table = Ends(len(PROMPT), after=2)
    host, _ = make_engine(max_live=4, table=table)
    device, ctx = make_engine(max_live=4, table=table, device_top_k=2, chained=4)
    requests = [("a", PROMPT, 1, {"max_tokens": 6, "min_tokens": 5})]
    assert outputs_of(device, requests) == outputs_of(host, requests)
    assert device.stats.device_undecided > 0
    assert device.stats.device_decoded_again == device.stats.device_undecided
    assert ctx.whole_decodes == device.stats.device_decoded_again  # only those were whole


def test_scratch_is_the_id_after_the_budget_s() -> None:
    engine, ctx = make_engine(max_live=4, cache_paths=2, device_top_k=K, chained=4)
    assert isinstance(ctx, FakeContext)
    assert engine.device is not None
    assert engine.device.scratch == engine.scheduler.budget.n_seq == ctx.n_seq_max - 1
    assert N_VOCAB > K


def test_the_scratch_id_comes_out_of_the_cached_paths_at_llama_cpp_s_limit() -> None:
    settings = Settings(
        max_sequences=128, reserve_sequences=8, cache_paths=120, backend_sampling="on"
    )
    assert kv_budget(settings, 4096).n_seq == MAX_SEQUENCE_IDS - 1
    options = context_options(settings, 4096)
    assert options.n_seq_max == MAX_SEQUENCE_IDS
    assert (options.device_top_k, options.chained) == (DEVICE_TOP_K, settings.max_n)
    off = Settings(max_sequences=128, reserve_sequences=8, cache_paths=120, backend_sampling="off")
    assert context_options(off, 4096).n_seq_max == kv_budget(off, 4096).n_seq == 256
    assert context_options(off, 4096).device_top_k == 0
    # auto: on only where layers go to a GPU, which this machine has none of
    auto = Settings(backend_sampling="auto")
    assert backend_sampling(auto) == offloaded(auto)

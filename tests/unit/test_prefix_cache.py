"""The prefix cache's bookkeeping, without a model."""

from __future__ import annotations

import random

from llama_srb.engine.kv import KvBudget, KvOp, PrefixCache, common_prefix
from llama_srb.engine.scheduler import Scheduler
from llama_srb.engine.sequence import Request, RequestStatus, Sequence
from llama_srb.sampling.params import SamplingParams


def make(rid: str, prompt: list[int], n: int = 1, max_tokens: int = 4) -> Request:
    return Request(
        rid,
        prompt,
        SamplingParams(max_tokens=max_tokens),
        [Sequence(index=i) for i in range(n)],
    )


def distinct_prefixes(paths: list[list[int]]) -> int:
    return len({tuple(p[:k]) for p in paths for k in range(1, len(p) + 1)})


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = [rng.randrange(3) for _ in range(rng.randrange(12))]
        expected = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert common_prefix(a, b) == expected


def test_cells_counts_each_shared_prefix_once() -> None:
    cache = PrefixCache(max_cells=1000)
    rng = random.Random(1)
    paths = []
    for seq_id in range(12):
        path = [rng.randrange(3) for _ in range(rng.randrange(1, 10))]
        cache.park(seq_id, path)
        paths.append(path)
        assert cache.cells() == distinct_prefixes([p.tokens for p in cache.paths])


def test_parking_shares_cells_with_the_best_match_and_drops_covered_paths() -> None:
    cache = PrefixCache(max_cells=1000)
    assert cache.park(7, [1, 2, 3]) == ([], [])
    ops, freed = cache.park(8, [1, 2, 3, 4, 5])
    # The new path re-points its first 3 cells at path 7's, then path 7 (a prefix) goes.
    assert ops == [KvOp.remove(8, 0, 3), KvOp(7, 8, 0, 3), KvOp.remove(7)]
    assert freed == [7]
    assert [p.seq_id for p in cache.paths] == [8]
    # A path the cache already covers is not kept.
    ops, freed = cache.park(9, [1, 2])
    assert ops == [KvOp.remove(9)] and freed == [9]


def test_a_request_forks_from_the_cache_and_pins_its_source() -> None:
    budget = KvBudget(max_live=4, n_cells=100, cache_paths=4, cache_cells=50)
    first = make("a", [1, 2, 3, 4, 5])
    budget.admit(first)
    budget.release_sequence(first, first.sequences[0].seq_id, [1, 2, 3, 4, 5, 6])
    budget.release_prompt(first)
    second = make("b", [1, 2, 3, 4, 5, 6, 7, 8])
    ops = budget.admit(second)
    assert ops == [KvOp(0, second.primary.seq_id, 0, 6)]
    assert second.n_prefilled == second.n_cached == 6
    assert budget.cells_reserved == 8 - 6 + 4
    assert budget.cache.paths[0].pins == 1
    assert budget.cache.evict_lru() is None  # pinned: a running request counts on it
    budget.release_sequence(second, second.primary.seq_id, None)
    budget.release_prompt(second)
    assert budget.cache.paths[0].pins == 0
    assert budget.cells_reserved == 0


def test_the_last_prompt_token_is_always_decoded_again() -> None:
    budget = KvBudget(max_live=2, n_cells=100, cache_paths=2, cache_cells=50)
    budget.cache.park(5, [1, 2, 3])
    _, shared = budget.match(make("x", [1, 2, 3]))
    assert shared == 2


def test_admission_evicts_cached_paths_lru_first_when_cells_run_short() -> None:
    budget = KvBudget(max_live=2, n_cells=20, cache_paths=4, cache_cells=20)
    budget.cache.park(budget._free_ids.pop(), [9] * 8)  # older
    budget.cache.park(budget._free_ids.pop(), [8] * 8)
    request = make("big", [1] * 10, max_tokens=2)  # needs 12 cells; 4 are free
    assert budget.can_admit(request)
    ops = budget.admit(request)
    evicted = [op.dst for op in ops if op.is_remove]
    assert len(evicted) == 1
    assert [p.tokens[0] for p in budget.cache.paths] == [8]


def test_cache_never_exceeds_its_cell_budget() -> None:
    budget = KvBudget(max_live=1, n_cells=100, cache_paths=8, cache_cells=10)
    for i in range(6):
        request = make(str(i), [100 + i] * 3)
        budget.admit(request)
        budget.release_sequence(request, request.primary.seq_id, [100 + i] * 4)
        budget.release_prompt(request)
        assert budget.cache.cells() <= 10
    assert budget.free_ids + len(budget.cache.paths) == budget.n_seq


def test_concurrent_requests_with_one_prompt_compute_it_once() -> None:
    s = Scheduler(KvBudget(max_live=8, n_cells=1000, cache_paths=8, cache_cells=500), n_batch=64)
    prompt = list(range(100))
    first, second = make("a", prompt), make("b", [*prompt, 7])
    s.add(first)
    s.add(second)
    plan = s.schedule()
    # Only the first computes; the second waits for it instead of duplicating the work.
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("a", 0, 64)]
    first.n_prefilled = 64
    plan = s.schedule()
    assert plan.kv_ops == [KvOp(first.primary.seq_id, second.primary.seq_id, 0, 64)]
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("a", 64, 99)]
    first.n_prefilled = 99
    plan = s.schedule()
    assert plan.kv_ops == [KvOp(first.primary.seq_id, second.primary.seq_id, 64, 99)]
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("a", 99, 100)]
    first.n_prefilled = 100
    first.status = RequestStatus.DECODING
    plan = s.schedule()
    assert plan.kv_ops == [KvOp(first.primary.seq_id, second.primary.seq_id, 99, 100)]
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("b", 100, 101)]
    assert second.n_cached == 100


def test_without_the_cache_nothing_is_shared() -> None:
    s = Scheduler(KvBudget(max_live=8, n_cells=1000), n_batch=256)
    prompt = list(range(100))
    s.add(make("a", prompt))
    s.add(make("b", prompt))
    plan = s.schedule()
    assert [c.request.request_id for c in plan.prefill] == ["a", "b"]
    assert plan.kv_ops == []

"""The prefix cache's bookkeeping and policy, without a model. The budget is driven through
its own calls (admit → Grant, release_sequence, release_request) and never writes to a
request; the scheduler's tests below reach request state through the scheduler's calls."""

from __future__ import annotations

import random

from llama_srb.config import MIN_AUTO_N_CTX, fit_n_ctx
from llama_srb.engine.kv import (
    MIN_SHARED_TOKENS,
    NO_SOURCE,
    Grant,
    KvBudget,
    KvOp,
    PrefixCache,
    as_tokens,
    common_prefix,
)
from llama_srb.engine.prefix_index import SourceKind
from llama_srb.engine.request import Request, RequestStatus
from llama_srb.engine.scheduler import Scheduler
from llama_srb.engine.tiers import TierStore
from tests.unit.fake_context import bare_request
from tests.unit.test_scheduler import computed

BOS = 2
_fresh = iter(range(1000, 10**9))


def make(rid: str, prompt: list[int], n: int = 1, max_tokens: int = 4) -> Request:
    return bare_request(rid, prompt, n, max_tokens=max_tokens)


def text(length: int) -> list[int]:
    """Tokens no other text shares."""
    return [next(_fresh) for _ in range(length)]


def run(budget: KvBudget, request: Request, generated: list[list[int]] | None = None) -> Grant:
    """Admit `request`, end its branches (branch i's cells hold its prompt + generated[i]),
    then end the request: what the scheduler asks of the budget through a request's life.
    Returns what admission granted (the sequence ids, the prompt tokens forked)."""
    assert budget.can_admit(request)
    grant = budget.admit(request)
    paths = generated or [[]] * request.n_branches
    for seq_id, tokens in zip(grant.seq_ids, paths, strict=True):
        budget.release_sequence(request, seq_id, request.prompt + tokens)
    budget.release_request(request)
    return grant


def distinct_prefixes(paths: list[list[int]]) -> int:
    return len({tuple(p[:k]) for p in paths for k in range(1, len(p) + 1)})


def check_invariants(budget: KvBudget) -> None:
    cache = budget.cache
    paths = [list(p.tokens) for p in cache.paths]
    assert cache.cells() == distinct_prefixes(paths) == cache.cells_of(cache.paths)
    assert budget.cells_used <= budget.n_cells
    assert cache.idle_cells() <= cache.max_idle_cells


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
        assert common_prefix(as_tokens(a), as_tokens(b)) == expected


def test_cells_counts_each_shared_prefix_once() -> None:
    cache = PrefixCache(max_idle_cells=1000)
    rng = random.Random(1)
    for seq_id in range(12):
        cache.park(seq_id, [rng.randrange(3) for _ in range(rng.randrange(1, 10))])
        paths = [list(p.tokens) for p in cache.paths]
        assert cache.cells() == distinct_prefixes(paths) == cache.cells_of(cache.paths)
    while cache.paths:  # and as paths go
        cache.evict_lru()
        assert cache.cells() == distinct_prefixes([list(p.tokens) for p in cache.paths])


def test_parking_shares_cells_with_the_best_match_and_drops_covered_paths() -> None:
    cache = PrefixCache(max_idle_cells=1000)
    assert cache.park(7, [1, 2, 3]) == ([], [])
    ops, freed = cache.park(8, [1, 2, 3, 4, 5])
    # The new path re-points its first 3 cells at path 7's, then path 7 (a prefix) goes.
    assert ops == [KvOp.remove(8, 0, 3), KvOp(7, 8, 0, 3), KvOp.remove(7)]
    assert freed == [7]
    assert [p.seq_id for p in cache.paths] == [8]
    # A path the cache already covers is not kept.
    ops, freed = cache.park(9, [1, 2])
    assert ops == [KvOp.remove(9)] and freed == [9]


def test_every_pair_of_paths_knows_its_common_prefix_exactly() -> None:
    """Parking compares a path with the newest one, then only where that leaves the
    answer open: siblings (a shared prompt, parted at the next token or later), strangers
    and prefixes of each other all get the prefix a full comparison gives."""
    rng = random.Random(2)
    for trial in range(20):
        cache = PrefixCache(max_idle_cells=10_000)
        prompt = [rng.randrange(3) for _ in range(rng.randrange(0, 6))]
        for seq_id in range(12):
            head = prompt if rng.random() < 0.7 else []
            tail = [rng.randrange(2) for _ in range(rng.randrange(0, 5))]
            if head + tail:
                cache.park(seq_id, head + tail)
            for a in cache.paths:
                for b in cache.paths:
                    if a is not b:
                        assert a.shared[b.seq_id] == common_prefix(a.tokens, b.tokens), trial


def test_a_path_whose_cells_another_sequence_holds_moves_what_it_does_not_share() -> None:
    """Backend sampling parks a branch's cells on an id without the device's cut: they
    are copied over but for the prefix the best match gives, then removed where they were."""
    cache = PrefixCache(max_idle_cells=1000)
    cache.park(7, [1, 2, 3])
    ops, freed = cache.park(8, [1, 2, 3, 4, 5], cells_on=2)
    assert ops == [KvOp(2, 8, 3), KvOp(7, 8, 0, 3), KvOp.remove(2), KvOp.remove(7)]
    assert freed == [7]
    ops, freed = cache.park(9, [4, 4], cells_on=1)  # it shares nothing: all of it moves
    assert ops == [KvOp(1, 9), KvOp.remove(1)] and freed == []
    ops, freed = cache.park(10, [1, 2], cells_on=3)  # covered already: nothing moves
    assert ops == [KvOp.remove(3)] and freed == [10]
    saved = PrefixCache(max_idle_cells=3, save_evicted=True)
    ops, freed = saved.park(11, [5, 6, 7, 8], cells_on=4)  # too long to stay: saved from 4
    assert [(type(op).__name__, op.dst) for op in ops] == [("KvSave", 4), ("KvOp", 4)]
    assert ops[1].is_remove and freed == [11] and not saved.paths


def test_a_request_forks_from_the_cache_and_pins_its_source() -> None:
    budget = KvBudget(max_live=4, n_cells=500, cache_paths=4, cache_cells=500)
    story = [BOS, *text(40)]
    assert run(budget, make("a", story[:-1]), [story[-1:]]).forked == 0
    second = make("b", [*story, *text(2)])
    grant = budget.admit(second)
    assert grant.ops == (KvOp(0, grant.seq_ids[0], 0, len(story)),)
    assert grant.forked == len(story)
    assert budget.cells_reserved == 2 + 4
    assert budget.cache.paths[0].pins == 1
    assert budget.cache.evict_lru() is None  # pinned: a running request counts on it
    budget.release_sequence(second, grant.seq_ids[0], None)
    budget.release_request(second)
    assert budget.cache.paths[0].pins == 0
    assert budget.cells_reserved == 0


def test_the_last_prompt_token_is_always_decoded_again() -> None:
    budget = KvBudget(max_live=2, n_cells=100, cache_paths=2, cache_cells=100)
    story = [BOS, *text(40)]
    budget.cache.park(5, story)
    shared = budget.match(make("x", story)).shared
    assert shared == len(story) - 1


def test_admission_evicts_cached_paths_lru_first_when_cells_run_short() -> None:
    budget = KvBudget(max_live=2, n_cells=20, cache_paths=4, cache_cells=20)
    run(budget, make("older", [9] * 7, max_tokens=1), [[9]])
    run(budget, make("newer", [8] * 7, max_tokens=1), [[8]])
    request = make("big", [1] * 10, max_tokens=2)  # needs 12 cells; 4 are free
    assert budget.can_admit(request)
    evicted = [op.dst for op in budget.admit(request).ops if op.is_remove]
    assert len(evicted) == 1
    assert [p.tokens[0] for p in budget.cache.paths] == [8]


def test_an_explicit_cache_budget_bounds_the_idle_cells() -> None:
    budget = KvBudget(max_live=1, n_cells=100, cache_paths=8, cache_cells=10)
    for i in range(6):
        run(budget, make(str(i), [100 + i] * 3), [[100 + i]])
        assert budget.cache.cells() <= 10
        check_invariants(budget)
    assert budget.free_ids + len(budget.cache.paths) == budget.n_seq


# -- the policy: long stories stay, trivial prefixes do not pin, LRU across writers ------


def test_by_default_the_cache_may_use_every_cell_no_request_needs() -> None:
    budget = KvBudget(max_live=8, n_cells=1000, cache_paths=8, cache_cells=1000)
    story = [BOS, *text(700)]  # 70% of the context
    branches = [text(20) for _ in range(4)]
    run(budget, make("root", story, n=4, max_tokens=20), branches)
    assert budget.cache.cells() == 700 + 1 + 4 * 20  # the story once, every branch's tail
    # Continue branch A, then A's child, then go back to branch B: each forks all it can.
    children = [text(20) for _ in range(4)]
    a = run(budget, make("A", story + branches[0], n=4, max_tokens=20), children)
    assert a.forked == len(story) + 20 - 1
    child = story + branches[0] + children[0]
    assert run(budget, make("A1", child, n=2)).forked == len(child) - 1
    assert run(budget, make("B", story + branches[1], n=2)).forked == len(story) + 20 - 1
    check_invariants(budget)


def test_a_trivial_shared_prefix_neither_pins_nor_costs_the_new_path() -> None:
    budget = KvBudget(max_live=4, n_cells=3000, cache_paths=8, cache_cells=3000)
    long_story = [BOS, *text(2000)]
    run(budget, make("long", long_story), [text(8)])
    prompt = [BOS, *text(94)]  # shares only the BOS token with the cached story
    first = make("new", prompt, max_tokens=8)
    assert budget.match(first) == NO_SOURCE
    grant = budget.admit(first)
    assert grant.forked == 0 and not any(p.pins for p in budget.cache.paths)
    budget.release_sequence(first, grant.seq_ids[0], prompt + text(8))
    budget.release_request(first)
    again = run(budget, make("again", prompt, max_tokens=8))
    assert again.forked == len(prompt) - 1  # cached on its second try
    assert len(budget.cache.paths) == 2  # and the long story is still there
    assert budget.match(make("x", [BOS, *text(MIN_SHARED_TOKENS)])) == NO_SOURCE


def test_parking_does_not_evict_the_parked_path_for_an_unrelated_pinned_one() -> None:
    budget = KvBudget(max_live=4, n_cells=3000, cache_paths=8, cache_cells=600)
    story = [BOS, *text(500)]
    run(budget, make("story", story), [text(4)])
    reader = make("reader", [*story, *text(2)], max_tokens=50)  # pins the story's path
    budget.admit(reader)
    short = make("short", [BOS, *text(200)])
    run(budget, short, [text(4)])
    # 505 pinned + 205 idle cells exceed 600, but only the 205 idle ones count.
    assert any(p.tokens[1] == short.prompt[1] for p in budget.cache.paths)
    assert run(budget, make("short again", short.prompt)).forked == len(short.prompt) - 1
    check_invariants(budget)


def test_writers_keep_their_hits_while_their_stories_fit_then_the_lru_story_goes() -> None:
    budget = KvBudget(max_live=8, n_cells=1000, cache_paths=16, cache_cells=1000)
    stories = {w: [BOS, *text(250)] for w in ("w1", "w2", "w3")}
    picked = {w: text(10) for w in stories}
    for w, story in stories.items():  # each writer's root: n=2
        run(budget, make(w, story, n=2, max_tokens=10), [picked[w], text(10)])
    for w, story in stories.items():  # interleaved: each continues its first branch
        grant = run(budget, make(w, story + picked[w], n=2, max_tokens=10), [text(10)] * 2)
        assert grant.forked == len(story) + 10 - 1
    check_invariants(budget)
    # A fourth writer's story does not fit beside the three: the least recent one goes.
    run(budget, make("w4", [BOS, *text(300)], n=2, max_tokens=10))
    check_invariants(budget)
    for w in ("w2", "w3"):
        assert run(budget, make(w, stories[w] + picked[w])).forked == 250 + 10
    assert run(budget, make("w1", [*stories["w1"], *text(3)])).forked == 0


def test_a_running_request_is_always_admitted_over_idle_paths() -> None:
    budget = KvBudget(max_live=8, n_cells=1000, cache_paths=16, cache_cells=1000)
    for i in range(9):
        run(budget, make(str(i), [BOS, *text(100)]), [text(8)])
    assert budget.cache.cells() > 900  # the cache has taken the whole context
    big = make("big", [BOS, *text(600)], n=4, max_tokens=90)  # 960 cells
    assert budget.can_admit(big)
    budget.admit(big)
    assert budget.cells_used <= budget.n_cells
    check_invariants(budget)


def test_a_request_waits_only_for_cells_running_requests_hold() -> None:
    budget = KvBudget(max_live=8, n_cells=1000, cache_paths=16, cache_cells=1000)
    story = [BOS, *text(500)]
    run(budget, make("story", story))
    reader = make("reader", [*story, *text(2)], max_tokens=100)  # pins 501, reserves 102
    (reader_seq,) = budget.admit(reader).seq_ids
    big = make("big", [BOS, *text(300)], max_tokens=250)  # 551 cells: 603 + 551 > 1000
    assert not budget.can_admit(big)
    budget.release_sequence(reader, reader_seq, reader.prompt + text(4))
    budget.release_request(reader)
    assert budget.can_admit(big)  # the story is idle now: evicted for the running request
    budget.admit(big)
    assert not budget.cache.paths
    check_invariants(budget)


def test_random_traffic_keeps_the_books_exact() -> None:
    rng = random.Random(7)
    budget = KvBudget(max_live=6, n_cells=600, cache_paths=6, cache_cells=600)
    stories = [[BOS, *text(rng.randrange(40, 200))] for _ in range(5)]
    running: list[tuple[Request, Grant]] = []
    for step in range(400):
        if running and (rng.random() < 0.5 or len(running) > 2):
            request, grant = running.pop(rng.randrange(len(running)))
            for seq_id in grant.seq_ids:
                path = request.prompt + text(rng.randrange(0, 5)) if rng.random() < 0.9 else None
                budget.release_sequence(request, seq_id, path)
            budget.release_request(request)
        else:
            story = rng.choice(stories)
            prompt = story[: rng.randrange(2, len(story) + 1)] + text(rng.randrange(1, 30))
            request = make(str(step), prompt, n=rng.randrange(1, 4), max_tokens=8)
            if budget.can_admit(request):
                running.append((request, budget.admit(request)))
        check_invariants(budget)
        live_ids = sum(r.n_branches for r, _ in running)
        assert budget.free_ids + len(budget.cache.paths) + live_ids == budget.n_seq


# -- one index: cached paths, tiers and running requests under one set of rules -----------


def test_one_index_finds_the_longest_source_cached_tiered_or_running() -> None:
    store = TierStore(host_budget=1 << 20)
    budget = KvBudget(max_live=4, n_cells=2000, cache_paths=4, cache_cells=2000, tiers=store)
    story, picked = [BOS, *text(100)], text(10)
    run(budget, make("root", story, max_tokens=10), [picked])  # cached: story + picked
    saved = [*story, *picked, *text(45)]
    store.put(as_tokens(saved), b"cells")  # a tier entry 45 tokens further
    assert budget.match(make("x", [*saved, 7])).kind is SourceKind.TIER
    near = [*story, *picked, *saved[111:131], 7]  # 20 further only: not worth a restore
    found = budget.match(make("y", near))
    assert (found.kind, found.shared) == (SourceKind.CACHED, len(story) + 10)
    # A running request, its branch streaming: its released tokens are a source too.
    reader = make("reader", [*story, *picked, 5], max_tokens=20)
    grant = budget.admit(reader)
    assert grant.source.kind is SourceKind.CACHED and grant.forked == len(story) + 10
    reader.status, reader.n_prefilled = RequestStatus.DECODING, reader.prompt_len
    branch = reader.branches[0]
    branch.seq_id, branch.tokens = grant.seq_ids[0], text(6)  # its newest has no cell yet
    fork = make("fork", [*reader.prompt, *branch.tokens, 9])
    found = budget.match(fork)
    assert (found.kind, found.lender, found.seq_id) == (SourceKind.LIVE, reader, branch.seq_id)
    assert found.shared == reader.prompt_len + 5
    # Equal lengths: the cached path before the running request's sequence.
    assert budget.match(make("z", [*story, *picked, 8])).kind is SourceKind.CACHED
    # A fork into a branch's text is worth any length; a prompt's start only from 32.
    short = make("short", [BOS, *text(4)], max_tokens=8)
    run(budget, short, [[3, 4, 5]])
    assert budget.match(make("s1", [*short.prompt, 3, 4, 9])).shared == len(short.prompt) + 2
    assert budget.match(make("s2", [*short.prompt[:4], 9])) == NO_SOURCE


def test_a_fork_of_a_running_request_is_lent_its_cells_not_reserved_twice() -> None:
    budget = KvBudget(max_live=4, n_cells=1000, cache_paths=4, cache_cells=1000)
    story = [BOS, *text(300)]
    parent = make("parent", story, n=2, max_tokens=200)
    seqs = budget.admit(parent).seq_ids
    parent.status, parent.n_prefilled = RequestStatus.DECODING, len(story)
    for branch, seq_id in zip(parent.branches, seqs, strict=True):
        branch.seq_id, branch.tokens = seq_id, text(50)
    assert budget.cells_reserved == 301 + 400
    # 351 + 290 more cells do not fit beside the parent's 701; 350 of them are lent.
    child = make("child", [*story, *parent.branches[0].tokens[:49], 7], max_tokens=290)
    assert budget.can_admit(child)
    grant = budget.admit(child)
    assert grant.source.lender is parent and grant.forked == 350
    assert budget.cells_reserved == 701 + 1 + 290
    # The parent ends first: its cells stay counted (and forkable) while the child runs.
    for branch in parent.branches:
        budget.release_sequence(parent, branch.seq_id, story + branch.tokens[:49])
    assert budget.release_request(parent) == []
    assert budget.cells_reserved == 301 + 2 * 49 + 1 + 290
    assert budget.cache.paths == []
    budget.release_sequence(child, grant.seq_ids[0], child.prompt + text(10))
    budget.release_request(child)  # then both are parked, the shared cells once
    assert budget.cells_reserved == 0
    check_invariants(budget)
    assert budget.cache.cells() == 301 + 2 * 49 + 1 + 10


def test_a_fork_evicts_no_cached_story_for_cells_it_shares() -> None:
    """bench/bench_live.py's 8,000-token case on the books alone: counted whole, the fork
    made admission evict (and save down a tier) every cached story in its step."""
    budget = KvBudget(max_live=16, n_cells=20000, cache_paths=64, cache_cells=20000)
    for _ in range(4):
        run(budget, make("old", [BOS, *text(1900)], n=2, max_tokens=40), [text(40)] * 2)
    cached = budget.cache.cells()
    parent = make("parent", [BOS, *text(7999)], n=8, max_tokens=160)
    seqs = budget.admit(parent).seq_ids
    parent.status, parent.n_prefilled = RequestStatus.DECODING, parent.prompt_len
    for branch, seq_id in zip(parent.branches, seqs, strict=True):
        branch.seq_id, branch.tokens = seq_id, text(41)
    fork = make("fork", [*parent.prompt, *parent.branches[0].tokens[:40]], n=4, max_tokens=8)
    grant = budget.admit(fork)
    assert grant.forked == fork.prompt_len - 1
    assert [op for op in grant.ops if op.is_remove] == [] and budget.cache.cells() == cached


# -- sharing with live requests ------------------------------------------------------------


def test_concurrent_requests_with_one_prompt_compute_it_once() -> None:
    s = Scheduler(KvBudget(max_live=8, n_cells=1000, cache_paths=8, cache_cells=500), n_batch=64)
    prompt = list(range(100))
    first, second = make("a", prompt), make("b", [*prompt, 7])
    s.add(first)
    s.add(second)
    plan = computed(s, s.schedule())
    # Only the first computes; the second waits for it instead of duplicating the work.
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("a", 0, 64)]
    plan = computed(s, s.schedule())
    assert plan.kv_ops == [KvOp(first.primary.seq_id, second.primary.seq_id, 0, 64)]
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("a", 64, 99)]
    plan = computed(s, s.schedule())
    assert plan.kv_ops == [KvOp(first.primary.seq_id, second.primary.seq_id, 64, 99)]
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("a", 99, 100)]
    assert first.status is RequestStatus.DECODING  # its prompt read: it decodes from here
    first.primary.tokens.append(7)  # its first token, sampled from the prompt's last row
    plan = s.schedule()
    assert plan.kv_ops == [KvOp(first.primary.seq_id, second.primary.seq_id, 99, 100)]
    assert [(c.request.request_id, c.start, c.end) for c in plan.prefill] == [("b", 100, 101)]
    assert second.n_cached == 100


def test_prompts_that_share_only_a_few_tokens_are_computed_side_by_side() -> None:
    s = Scheduler(KvBudget(max_live=8, n_cells=1000, cache_paths=8, cache_cells=500), n_batch=256)
    s.add(make("a", [BOS, *text(100)]))
    s.add(make("b", [BOS, *text(100)]))
    plan = s.schedule()
    assert [c.request.request_id for c in plan.prefill] == ["a", "b"]  # b does not wait
    assert plan.kv_ops == []


def test_without_the_cache_nothing_is_shared() -> None:
    s = Scheduler(KvBudget(max_live=8, n_cells=1000), n_batch=256)
    prompt = list(range(100))
    s.add(make("a", prompt))
    s.add(make("b", prompt))
    plan = s.schedule()
    assert [c.request.request_id for c in plan.prefill] == ["a", "b"]
    assert plan.kv_ops == []


# -- the context size ------------------------------------------------------------------------


def test_the_default_context_is_the_training_context_when_memory_allows() -> None:
    per_cell = 18 * 512 * 2  # Gemma 3 270M: 18 layers, one KV head of 256 + 256, f16
    n_ctx, why = fit_n_ctx(32768, per_cell, available=16 << 30)
    assert n_ctx == 32768 and "training context" in why
    assert fit_n_ctx(32768, per_cell, available=None)[0] == 32768


def test_the_default_context_shrinks_to_fit_memory_but_not_below_the_floor() -> None:
    per_cell = 512 << 10  # a 7B model's f16 KV cell
    n_ctx, why = fit_n_ctx(131072, per_cell, available=(1 << 30) + (8 << 30))
    assert n_ctx == 8192 and n_ctx % 256 == 0 and "lowered" in why
    assert fit_n_ctx(131072, per_cell, available=1 << 30)[0] == MIN_AUTO_N_CTX
    assert fit_n_ctx(2048, per_cell, available=1 << 30)[0] == 2048  # never above training
    assert fit_n_ctx(0, per_cell, available=None)[0] == MIN_AUTO_N_CTX  # unknown: a floor

"""The engine over a fake context (logits from a table, no model): forks, aborts, decode
errors, live prefix sharing and admission under a full cache, in milliseconds."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from llama_srb.engine import engine as engine_module
from llama_srb.engine.build import Submission
from llama_srb.engine.request import FinishReason, Request, RequestStatus
from llama_srb.engine.runtime import Runtime
from llama_srb.sampling.constraint import GRAMMAR_COMPLETE
from llama_srb.sampling.cut import Ids, Row
from tests.unit.fake_context import (
    BOS,
    EOS,
    Ends,
    FakeModel,
    FakeSampler,
    Outputs,
    check_kv,
    expected,
    make_engine,
    make_request,
    run,
)

_next_letter = iter(range(10**9))


def story(length: int) -> list[int]:
    """A prompt no other story shares (beyond its BOS)."""
    salt = next(_next_letter)
    return [BOS, *[2 + (salt * 7 + i * (salt % 5 + 1)) % 26 for i in range(length - 1)]]


def closed_once(request: Request) -> bool:
    return all(
        isinstance(s.sampler, FakeSampler) and s.sampler.closed == 1 for s in request.branches
    )


def test_branches_fork_from_one_prefill_and_match_each_decoded_alone() -> None:
    engine, ctx = make_engine(n_batch=16)
    prompt = story(40)
    request = make_request("a", prompt, n=3, max_tokens=6)
    assert engine.add(request) == []
    out = run(engine)
    assert out.tokens("a") == {i: expected(prompt, i, 6) for i in range(3)}
    assert engine.stats.prompt_tokens_evaluated == len(prompt)  # once for all branches
    last = out.last("a")
    assert last.finished and last.completion_tokens == 18 and last.prompt_tokens == 40
    assert out.reasons("a") == {i: FinishReason.LENGTH for i in range(3)}
    assert request.status is RequestStatus.FINISHED and closed_once(request)
    # Parked: the prompt's cells once, and each branch's 5 decoded tokens (the 6th was
    # sampled, never decoded).
    assert len(ctx.cells) == len(prompt) + 3 * 5
    snapshot = engine.snapshot
    assert snapshot.stats.generated_tokens == 18 and snapshot.requests_running == 0
    assert snapshot.kv_cells_cached == len(ctx.cells) and snapshot.sequences_running == 0
    # every step that decoded says how long it spent outside llama_decode
    host = snapshot.stats.host_step_seconds
    assert host.count == snapshot.stats.steps and host.total > 0


def test_the_last_outputs_go_out_before_the_kv_cache_is_changed_for_what_ended() -> None:
    """A reader has its request's last tokens before the engine moves and drops the
    ended branches' cells (~190 sequence ops at n = 64); the step still returns with the
    cache settled, so the next step, or a caller that reads it, finds it so."""
    engine, ctx = make_engine(n_batch=16)
    prompt = story(30)
    engine.add(make_request("a", prompt, n=3, max_tokens=4))
    applied: list[tuple[int, ...]] = []

    def counted(op: Callable[..., None]) -> Callable[..., None]:
        def call(*args: int) -> None:
            applied.append(args)
            op(*args)

        return call

    ctx.seq_cp, ctx.seq_rm = counted(ctx.seq_cp), counted(ctx.seq_rm)  # type: ignore[method-assign]
    # when delivered: a request finished, the ops applied, the tokens /metrics counts
    seen: list[tuple[bool, int, int]] = []

    def deliver(outputs: list[Any]) -> None:
        generated = engine.snapshot.stats.generated_tokens
        seen.append((any(o.finished for o in outputs), len(applied), generated))

    while engine.has_work:
        assert engine.step(deliver)  # still the step's outputs, for the caller's bookkeeping
        check_kv(engine)
    finished, before, generated = seen[-1]
    assert finished and len(applied) > before  # the parking ops came after the delivery
    assert generated == 3 * 4  # and the published counters before it
    assert len(engine.scheduler.budget.cache.paths) == 3


def test_the_snapshot_is_renewed_when_a_request_comes_or_goes_not_on_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "SNAPSHOT_SECONDS", math.inf)  # never by the clock
    engine, _ = make_engine(n_batch=16, max_live=2)
    engine.add(make_request("a", story(12), n=2, max_tokens=6))
    engine.step()  # admitted, and its prompt read
    admitted = engine.snapshot
    assert admitted.requests_running == 1 and admitted.sequences_running == 2
    for _ in range(3):  # mid-stream: the counters move on, the published copy waits
        engine.step()
        assert engine.snapshot is admitted
    assert engine.branch_step.drawn > admitted.stats.generated_tokens
    engine.add(make_request("queued", story(12), n=2, max_tokens=2))  # no room: it waits
    engine.step()
    assert engine.snapshot.requests_waiting == 1
    run(engine)
    assert engine.snapshot.requests_running == engine.snapshot.requests_waiting == 0
    assert engine.snapshot.stats.generated_tokens == 16 == engine.branch_step.drawn
    monkeypatch.setattr(engine_module, "SNAPSHOT_SECONDS", 0.0)  # by the clock: every step
    engine.add(make_request("b", story(12), max_tokens=4))
    for _ in range(3):
        engine.step()
    assert engine.snapshot.stats.generated_tokens == engine.branch_step.drawn == 18


def test_a_deterministic_request_decodes_one_branch_for_all_its_choices() -> None:
    engine, ctx = make_engine(n_batch=16)
    prompt = story(20)
    one = make_request("g", prompt, n=1, max_tokens=5, temperature=0.0)
    request = Request(one.request_id, replace(one.spec, n_choices=3), one.branches, one.times)
    assert request.spec.n_branches == 1
    engine.add(request)
    out = run(engine)
    assert out.tokens("g") == {i: expected(prompt, 0, 5) for i in range(3)}
    assert out.reasons("g") == {i: FinishReason.LENGTH for i in range(3)}
    assert out.last("g").completion_tokens == 15  # what the client got: 3 choices of 5
    assert engine.stats.generated_tokens == 5 and len(ctx.cells) == len(prompt) + 4


def test_abort_mid_prefill_frees_the_request_and_keeps_what_was_computed() -> None:
    engine, _ = make_engine(n_batch=16)
    prompt = story(100)
    request = make_request("a", prompt, n=2, max_tokens=4)
    engine.add(request)
    out = Outputs()
    for _ in range(3):
        out.add(engine.step())
    check_kv(engine)
    assert request.status is RequestStatus.PREFILLING and request.n_prefilled == 48
    # prefill steps publish no text: the admission, then how far the prompt was read
    said = out.by_request["a"]
    assert said[0].admitted and not any(o.choices for o in said)
    assert [o.prompt_processed for o in said[1:]] == [16, 32, 48]
    out.add(engine.abort("a"))
    last = out.last("a")
    assert last.finished and last.error is None and last.completion_tokens == 0
    assert out.reasons("a") == {0: FinishReason.ABORT, 1: FinishReason.ABORT}
    assert closed_once(request) and not engine.has_work
    budget = engine.scheduler.budget
    assert budget.live == 0 and budget.cells_reserved == 0
    assert [list(p.tokens) for p in budget.cache.paths] == [prompt[:48]]
    check_kv(engine)
    assert engine.abort("a") == []  # gone: a second abort is a no-op

    again = make_request("b", prompt, max_tokens=3)
    engine.add(again)
    run(engine, out)
    assert again.n_cached == 48 and out.tokens("b") == {0: expected(prompt, 0, 3)}
    assert engine.stats.prompt_tokens_evaluated == len(prompt)  # the aborted part not again


def test_abort_while_decoding_caches_the_branches_and_a_waiting_request_just_leaves() -> None:
    engine, _ = make_engine(max_live=2)
    running = make_request("run", story(40), n=2, max_tokens=50)
    engine.add(running)
    out = Outputs()
    for _ in range(4):
        out.add(engine.step())
    waiting = make_request("wait", story(40), n=2)
    engine.add(waiting)
    out.add(engine.step())
    assert running.status is RequestStatus.DECODING
    assert waiting.status is RequestStatus.WAITING  # both seq ids are taken

    out.add(engine.abort("wait"))
    assert out.reasons("wait") == {0: FinishReason.ABORT, 1: FinishReason.ABORT}
    assert closed_once(waiting) and waiting.status is RequestStatus.FINISHED
    assert all(s.seq_id == -1 for s in waiting.branches)

    generated = [list(s.tokens) for s in running.branches]
    out.add(engine.abort("run"))
    assert out.reasons("run") == {0: FinishReason.ABORT, 1: FinishReason.ABORT}
    assert out.tokens("run") == {i: generated[i] for i in range(2)}
    paths = sorted(list(p.tokens) for p in engine.scheduler.budget.cache.paths)
    # Each branch's cells: the prompt and its tokens but the newest (never decoded).
    assert paths == sorted(running.prompt + g[:-1] for g in generated)
    check_kv(engine)
    assert not engine.has_work and closed_once(running)


def test_a_long_prompt_reports_each_chunk_read_and_its_cached_start() -> None:
    """The outputs the API streams as llama.cpp's prompt_progress: after each chunk that
    does not end the prompt, how many of its tokens are in the cache (cached ones too)."""
    engine, _ = make_engine(n_batch=16)
    prompt = story(60)
    engine.add(make_request("first", prompt, n=2, max_tokens=2))
    out = run(engine)
    progress = [o for o in out.by_request["first"] if o.prompt_processed is not None]
    read = [o.prompt_processed for o in progress]
    assert read[:3] == [16, 32, 48] and read == sorted(set(read)) and read[-1] < 60
    assert all(o.prompt_tokens == 60 and o.cached_tokens == 0 and not o.finished for o in progress)
    said = out.by_request["first"]  # the admission, the progress, then the tokens
    assert said[0].admitted and said[1 : 1 + len(progress)] == progress
    assert said[1 + len(progress)].choices
    assert out.tokens("first") == {i: expected(prompt, i, 2) for i in range(2)}

    # The same story, longer: its start comes from the cache, the rest is read.
    longer = [*prompt, *story(40)[1:]]
    engine.add(make_request("again", longer, n=1, max_tokens=1))
    out = run(engine)
    progress = [o for o in out.by_request["again"] if o.prompt_processed is not None]
    cached = progress[0].cached_tokens
    assert cached >= 56 and all(o.cached_tokens == cached for o in progress)
    read = [o.prompt_processed for o in progress]
    assert read[0] == cached + 16 and read == sorted(set(read)) and read[-1] < len(longer)


def test_a_decode_error_fails_the_requests_in_the_batch_and_the_engine_goes_on() -> None:
    engine, ctx = make_engine(n_batch=16, max_live=2)
    first = make_request("first", story(40), n=2, max_tokens=4)
    queued = make_request("queued", story(20), n=2, max_tokens=4)
    engine.add(first)
    engine.add(queued)
    out = Outputs()
    out.add(engine.step())
    ctx.fail_next = 1
    out.add(engine.step())
    last = out.last("first")
    assert last.finished and last.error is not None and "code 1" in last.error
    assert out.reasons("first") == {0: FinishReason.ERROR, 1: FinishReason.ERROR}
    assert closed_once(first) and "queued" not in out.by_request
    assert engine.scheduler.budget.cache.paths == []  # a failed request's cells are not kept
    check_kv(engine)
    run(engine, out)
    assert out.tokens("queued") == {i: expected(queued.prompt, i, 4) for i in range(2)}
    assert out.last("queued").error is None


def test_a_branch_that_cannot_sample_ends_its_request_alone() -> None:
    engine, _ = make_engine()
    broken = make_request("broken", story(40), n=2, max_tokens=4)
    fine = make_request("fine", story(30), n=2, max_tokens=4)

    class Broken(FakeSampler):
        def sample(self, row: Row, *rest: object) -> int:
            raise RuntimeError("sampler exploded")

    broken.branches[1].sampler = Broken()
    engine.add(broken)
    engine.add(fine)
    out = run(engine)
    assert out.last("broken").error == "sampling failed: RuntimeError: sampler exploded"
    assert out.reasons("broken") == {0: FinishReason.ERROR, 1: FinishReason.ERROR}
    assert out.tokens("fine") == {i: expected(fine.prompt, i, 4) for i in range(2)}
    assert out.last("fine").error is None
    assert engine.scheduler.budget.live == 0 and engine.scheduler.budget.cells_reserved == 0
    check_kv(engine)


def test_an_unexpected_error_in_a_step_fails_what_is_in_flight_and_keeps_serving() -> None:
    engine, _ = make_engine()
    first = make_request("first", story(40))
    stage = engine.sampling.run

    def exploding(*args: Any) -> Any:
        engine.sampling.run = stage  # type: ignore[method-assign]
        raise RuntimeError("stage exploded")

    engine.sampling.run = exploding  # type: ignore[method-assign]
    engine.add(first)
    out = run(engine)
    assert out.last("first").error == "engine error: stage exploded"
    assert engine.scheduler.budget.live == 0 and engine.scheduler.budget.cells_reserved == 0
    check_kv(engine)
    fine = make_request("fine", story(40), max_tokens=3)
    engine.add(fine)
    run(engine, out)
    assert out.tokens("fine") == {0: expected(fine.prompt, 0, 3)}


def test_a_prompt_being_prefilled_is_shared_live_not_computed_twice() -> None:
    engine, _ = make_engine(n_batch=16)
    prompt = story(80)
    first = make_request("first", prompt, max_tokens=3)
    second = make_request("second", [*prompt, *FakeModel.tokens("xyz")], n=2, max_tokens=3)
    engine.add(first)
    engine.add(second)
    out = run(engine)
    assert second.n_cached == 80 and out.last("second").cached_tokens == 80
    assert engine.stats.prompt_tokens_evaluated == 80 + 3
    assert engine.stats.prompt_tokens_cached == 80
    assert out.tokens("first") == {0: expected(prompt, 0, 3)}
    assert out.tokens("second") == {i: expected(second.prompt, i, 3) for i in range(2)}


def test_admission_under_a_full_cache_evicts_idle_paths_and_queues_what_cannot_fit() -> None:
    engine, ctx = make_engine(n_ctx=200, max_live=2, cache_paths=4)
    budget = engine.scheduler.budget
    out = Outputs()
    old = make_request("old", story(60), max_tokens=4)
    recent = make_request("recent", story(60), max_tokens=4)
    for request in (old, recent):
        engine.add(request)
        run(engine, out)
    assert budget.cache.cells() == len(ctx.cells) == 63 + 62  # the two share their BOS
    big = make_request("big", story(100), max_tokens=10)  # 110 cells: one path must go
    engine.add(big)
    out.add(engine.step())
    assert big.status is RequestStatus.PREFILLING
    assert [list(p.tokens)[:60] for p in budget.cache.paths] == [recent.prompt]  # LRU went
    check_kv(engine)
    late = make_request("late", story(80), max_tokens=20)  # 100 cells: not while big runs
    engine.add(late)
    out.add(engine.step())
    assert late.status is RequestStatus.WAITING and engine.has_work
    run(engine, out)
    assert late.status is RequestStatus.FINISHED and out.last("late").error is None
    assert out.tokens("late") == {0: expected(late.prompt, 0, 20)}
    assert out.tokens("big") == {0: expected(big.prompt, 0, 10)}
    never = make_request("never", story(150), max_tokens=60)  # 210 cells of 200
    refused = engine.add(never)
    assert [o.finished for o in refused] == [True] and refused[0].error is not None
    assert "210 KV cells, 200 exist" in refused[0].error and closed_once(never)
    assert not engine.has_work


def test_a_request_that_fits_only_without_its_cached_prefix_computes_it() -> None:
    engine, _ = make_engine(n_ctx=200, max_live=2)
    prompt = story(100)
    engine.add(make_request("first", prompt, max_tokens=50))
    out = run(engine)  # cached: the prompt and 49 generated tokens, 149 cells
    # 200 cells: it fits alone, but not beside the 149-cell path it would fork from.
    again = make_request("again", [*prompt, 5], max_tokens=99)
    engine.add(again)
    run(engine, out)
    assert again.status is RequestStatus.FINISHED and again.n_cached == 0
    assert out.tokens("again") == {0: expected(again.prompt, 0, 99)}


def test_endings_eos_min_tokens_stop_strings_grammar_and_zero_tokens() -> None:
    prompt = story(40)
    engine, _ = make_engine(table=Ends(len(prompt), after=3))
    requests = {
        "eos": make_request("eos", prompt, max_tokens=10),
        "min": make_request("min", prompt, max_tokens=10, min_tokens=5),
        "ignore": make_request("ignore", prompt, max_tokens=6, ignore_eos=True),
        "zero": make_request("zero", prompt, max_tokens=0),
    }
    for request in requests.values():
        engine.add(request)
    out = run(engine)
    assert len(out.tokens("eos")[0]) == 3 and out.reasons("eos") == {0: FinishReason.STOP}
    assert len(out.tokens("min")[0]) == 5 and out.reasons("min") == {0: FinishReason.STOP}
    assert EOS not in out.tokens("ignore")[0] and len(out.tokens("ignore")[0]) == 6
    assert out.reasons("zero") == {0: FinishReason.LENGTH} and out.tokens("zero") == {0: []}
    assert all(closed_once(r) for r in requests.values())

    engine, _ = make_engine()
    prompt = story(40)
    text = b"".join(FakeModel.piece(t) for t in expected(prompt, 0, 8)).decode()
    stop = text[3:6]
    stopped = make_request("stop", prompt, max_tokens=8, stop=(stop,))
    engine.add(stopped)
    out = run(engine)
    assert out.text("stop") == {0: text[: text.index(stop)]}  # nothing of the stop leaks
    assert out.reasons("stop") == {0: FinishReason.STOP}

    class Grammar(FakeSampler):  # a grammar with nothing left to allow after two tokens
        drawn = 0

        def sample(self, row: Row, forbidden: Ids | None = None, *rest: object) -> int:
            self.drawn += 1
            return GRAMMAR_COMPLETE if self.drawn > 2 else super().sample(row, forbidden)

    constrained = make_request("grammar", prompt, max_tokens=8)
    constrained.branches[0].sampler = Grammar()
    engine.add(constrained)
    run(engine, out)
    assert out.tokens("grammar") == {0: expected(prompt, 0, 2)}
    assert out.reasons("grammar") == {0: FinishReason.STOP}


def test_logprobs_are_those_of_the_rows_before_the_eog_mask() -> None:
    prompt = story(40)
    engine, _ = make_engine(table=Ends(len(prompt), after=0))
    request = make_request("lp", prompt, max_tokens=2, min_tokens=2, logprobs=2)
    engine.add(request)
    out = run(engine)
    lse = math.log(sum(math.exp(-k) for k in range(28)))
    for output in out.by_request["lp"]:
        for choice in output.choices:
            assert choice.logprobs is not None and len(choice.logprobs) == 1
            entry = choice.logprobs[0]
            # EOS is the model's first choice (masked by min_tokens), so the token is its second.
            assert entry.token == choice.token_ids[0] and np.isclose(entry.logprob, -1 - lse)
            assert entry.top[0][0] == EOS and len(entry.top) == 2


def test_the_runtime_delivers_the_engine_outputs_and_a_reader_leaving_aborts() -> None:
    engine, _ = make_engine()
    prompt = story(40)

    async def scenario() -> tuple[dict[int, list[int]], bool]:
        runtime = Runtime(engine)
        runtime.start()
        try:
            tokens: dict[int, list[int]] = {}
            async for output in runtime.generate(
                Submission(make_request("a", prompt, n=2, max_tokens=5))
            ):
                for choice in output.choices:
                    tokens.setdefault(choice.index, []).extend(choice.token_ids)
            leaving = runtime.generate(Submission(make_request("b", story(40), max_tokens=500)))
            await anext(leaving)
            await leaving.aclose()  # the reader leaves: its request is aborted
            for _ in range(200):
                if not engine.scheduler.running:
                    break
                await asyncio.sleep(0.01)
            return tokens, not engine.scheduler.running
        finally:
            runtime.stop()

    tokens, freed = asyncio.run(scenario())
    assert tokens == {i: expected(prompt, i, 5) for i in range(2)}
    assert freed and engine.scheduler.budget.live == 0


def test_warm_up_without_a_bos_token_uses_a_valid_one() -> None:
    """A model without a BOS token reports -1 (SmolLM2 has one; others do not)."""
    engine, ctx = make_engine()
    engine.model.bos = -1  # type: ignore[misc]
    engine.warm_up()
    assert ctx.warmed_with == 0


def test_grammar_masks_are_computed_while_llama_decode_runs() -> None:
    """A call with constrained rows starts their masks before llama_decode and reads them
    after: the fake decode waits until the masks have begun (it would wait in vain if they
    were computed after it returned)."""
    engine, ctx = make_engine(n_batch=16)
    submitted, started = threading.Event(), threading.Event()
    seen: list[bool] = []

    class Masks:
        def fill(self, matchers: list[object]) -> npt.NDArray[np.int32]:
            started.set()
            return np.full((len(matchers), 1), -1, dtype=np.int32)  # every token allowed

    submit = engine._mask_worker.submit

    def submitting(fn: Any) -> Any:
        submitted.set()
        return submit(fn)

    decode = ctx.decode

    def decode_after_masks_began(batch: Any) -> None:
        if submitted.is_set():
            seen.append(started.wait(10))
            submitted.clear()
            started.clear()
        decode(batch)

    engine._masks = Masks()  # type: ignore[assignment]
    engine._mask_worker.submit = submitting  # type: ignore[method-assign]
    ctx.decode = decode_after_masks_began  # type: ignore[method-assign]
    prompt = story(40)
    request = make_request("g", prompt, n=2, max_tokens=4)
    for branch in request.branches:
        branch.sampler.matcher = SimpleNamespace(error=None)  # type: ignore[union-attr]
    engine.add(request)
    out = run(engine)
    assert out.tokens("g") == {i: expected(prompt, i, 4) for i in range(2)}
    assert seen == [True] * 4  # the step that read the prompt's end, and three more

"""Live branching over the fake context: forks that share a running branch's cells, drops
(with refills) and steers at every phase of a branch, the KV books checked after every
step (fake_context.check_kv: a wrong fork or a cell freed too early changes what the fake
samples, so the expected tokens check the cells too)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from llama_srb.engine.best_of import BestOf
from llama_srb.engine.build import Built, Submission
from llama_srb.engine.engine import Engine
from llama_srb.engine.outputs import FinishReason, LiveRefused
from llama_srb.engine.request import Branch, Request, RequestStatus
from llama_srb.engine.runtime import Runtime
from llama_srb.sampling.text import TextStream
from tests.unit.fake_context import (
    BOS,
    FakeModel,
    FakeSampler,
    Outputs,
    check_kv,
    expected,
    make_engine,
    make_request,
    run,
)
from tests.unit.test_banned import banned_request, spell

PROMPT = [BOS, *FakeModel.tokens("onceuponatimeinakingdombytheseatherelivedanoldfisherman")]


def step_until(engine: Engine, out: Outputs, done: Callable[[], bool], limit: int = 500) -> None:
    for _ in range(limit):
        if done():
            return
        out.add(engine.step())
        check_kv(engine)
    raise AssertionError("never happened")


def fresh_branch(rank: int) -> Branch:
    return Branch(index=-1, sampler=FakeSampler(rank), text=TextStream(FakeModel.piece, ()))


def books_empty(engine: Engine) -> bool:
    budget = engine.scheduler.budget
    return budget.live == 0 and budget.cells_reserved == 0 and not engine.scheduler.running


# -- forks: any request shares any live text -----------------------------------------------


def test_a_fork_of_a_streaming_branch_forks_its_cells_and_reads_one_token() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=3, max_tokens=20)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[1].tokens) >= 8)
    text = list(parent.branches[1].tokens)  # its newest token has no cell yet
    read = engine.stats.prompt_tokens_evaluated
    child = make_request("c", PROMPT + text, n=2, max_tokens=5)
    engine.add(child)
    run(engine, out)
    assert out.tokens("c") == {i: expected(PROMPT + text, i, 5) for i in range(2)}
    assert child.n_cached == len(PROMPT) + len(text) - 1
    assert engine.stats.prompt_tokens_evaluated == read + 1
    assert out.tokens("p") == {i: expected(PROMPT, i, 20) for i in range(3)}  # untouched


def test_a_fork_from_inside_a_branch_reads_only_what_follows_the_shared_tokens() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=20)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 10)
    prompt = PROMPT + parent.branches[0].tokens[:6] + FakeModel.tokens("xyz")  # "at" a cursor
    read = engine.stats.prompt_tokens_evaluated
    child = make_request("c", prompt, max_tokens=4)
    engine.add(child)
    run(engine, out)
    assert out.tokens("c") == {0: expected(prompt, 0, 4)}
    assert child.n_cached == len(PROMPT) + 6
    assert engine.stats.prompt_tokens_evaluated == read + 3


def test_a_fork_of_a_short_prompt_shares_it_too() -> None:
    """Fewer than MIN_SHARED_TOKENS of prompt: a prompt that short is computed, but a fork
    into a branch's text pins nothing, so it shares whatever it can."""
    engine, _ = make_engine(n_batch=16)
    prompt = PROMPT[:8]
    parent = make_request("p", prompt, n=2, max_tokens=20)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[1].tokens) >= 4)
    text = list(parent.branches[1].tokens)
    child = make_request("c", prompt + text, max_tokens=3)
    engine.add(child)
    run(engine, out)
    assert child.n_cached == len(prompt) + len(text) - 1
    assert out.tokens("c") == {0: expected(prompt + text, 0, 3)}


def test_a_request_on_a_dropped_branch_of_a_running_request_shares_its_kept_cells() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=30)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 6)
    text = list(parent.branches[0].tokens)
    out.add(engine.drop("p", 0)[1])
    child = make_request("c", PROMPT + text, max_tokens=4)
    engine.add(child)
    run(engine, out)
    assert child.n_cached == len(PROMPT) + len(text) - 1  # from the ended branch's cells
    assert out.tokens("c") == {0: expected(PROMPT + text, 0, 4)}
    assert books_empty(engine)


# -- the KV books: a fork reserves only the cells it adds ------------------------------------------


def test_a_fork_reserves_only_the_cells_it_adds() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=3, max_tokens=20)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[1].tokens) >= 8)
    text = list(parent.branches[1].tokens)
    reserved = engine.scheduler.budget.cells_reserved
    child = make_request("c", PROMPT + text, n=2, max_tokens=5)
    engine.add(child)
    out.add(engine.step())  # admitted: its first sequence forks the parent's branch
    check_kv(engine)
    assert child.n_cached == len(PROMPT) + len(text) - 1
    # One cell of prompt (its last token, decoded again) and its branches' room: the
    # parent's cells are the parent's to count.
    assert engine.scheduler.budget.cells_reserved == reserved + 1 + 2 * 5
    run(engine, out)
    assert out.tokens("c") == {i: expected(PROMPT + text, i, 5) for i in range(2)}
    assert books_empty(engine)


def test_a_fork_that_fits_only_beside_its_shared_cells_starts_at_once() -> None:
    """57 + 2 x 60 cells of 200 are the parent's: a fork of 57 + 8 tokens, counted whole,
    would need 75 more and wait for the parent to end; it adds 11."""
    engine, _ = make_engine(n_ctx=200, n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=60)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 9)
    text = list(parent.branches[0].tokens[:8])
    child = make_request("c", PROMPT + text, max_tokens=10)
    engine.add(child)
    out.add(engine.step())
    assert child.status is not RequestStatus.WAITING and child.n_cached == len(PROMPT) + 7
    step_until(engine, out, lambda: child.status is RequestStatus.FINISHED)
    assert parent.status is RequestStatus.DECODING  # the child ran beside the parent
    run(engine, out)
    assert out.tokens("c") == {0: expected(PROMPT + text, 0, 10)}
    assert out.tokens("p") == {i: expected(PROMPT, i, 60) for i in range(2)}
    assert books_empty(engine)


@pytest.mark.parametrize("first", ["parent", "child"])
@pytest.mark.parametrize("how", ["length", "drop", "abort", "error"])
def test_lender_and_borrower_end_in_any_order_and_their_cells_are_counted_once(
    first: str, how: str
) -> None:
    """A fork's cells stay its lender's (the parent's) to count: when the parent ends
    first they stay, counted, until the child ends; when the child ends first, its cells
    stay beside the parent's; then both are parked together, their shared cells once.
    The books are checked after every step (check_kv)."""
    engine, ctx = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=60 if first == "child" else 12)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 5)
    text = list(parent.branches[0].tokens[:4])
    child = make_request("c", PROMPT + text, n=2, max_tokens=6 if first == "child" else 40)
    engine.add(child)
    step_until(engine, out, lambda: child.status is RequestStatus.DECODING)
    ender, other = (child, parent) if first == "child" else (parent, child)
    if how == "drop":
        for index in (0, 1):
            out.add(engine.drop(ender.request_id, index)[1])
    elif how == "abort":
        out.add(engine.abort(ender.request_id))
    elif how == "error":
        out.add(engine.fail([ender], "a decode failed"))
    else:
        step_until(engine, out, lambda: ender.status is RequestStatus.FINISHED)
    check_kv(engine)
    assert ender.status is RequestStatus.FINISHED
    assert other.status is RequestStatus.DECODING
    run(engine, out)
    assert books_empty(engine)
    assert len(ctx.cells) == engine.scheduler.budget.cache.cells()  # parked: each cell once
    if other is child or how == "length":
        assert out.tokens("c") == {
            i: expected(PROMPT + text, i, child.params.max_tokens) for i in range(2)
        }


def test_a_fork_of_a_fork_borrows_down_the_line_and_all_end_exact() -> None:
    engine, ctx = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=30)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[1].tokens) >= 5)
    first = PROMPT + parent.branches[1].tokens[:4]
    child = make_request("c", first, n=2, max_tokens=12)
    engine.add(child)
    step_until(engine, out, lambda: len(child.branches[0].tokens) >= 4)
    second = first + child.branches[0].tokens[:3]
    grandchild = make_request("g", second, max_tokens=6)
    reserved = engine.scheduler.budget.cells_reserved
    engine.add(grandchild)
    out.add(engine.step())
    check_kv(engine)
    assert grandchild.n_cached == len(second) - 1
    assert engine.scheduler.budget.cells_reserved == reserved + 1 + 6
    out.add(engine.abort("p"))  # the first lender goes first
    check_kv(engine)
    run(engine, out)
    assert out.tokens("g") == {0: expected(second, 0, 6)}
    assert books_empty(engine) and len(ctx.cells) == engine.scheduler.budget.cache.cells()


def test_a_prompt_read_by_an_earlier_request_is_borrowed_and_not_reserved_twice() -> None:
    """Two requests with one prompt: the second waits for the first's reading and forks
    it as it comes; its reservation shrinks by what it forks."""
    engine, _ = make_engine(n_batch=16)
    first = make_request("a", PROMPT, n=2, max_tokens=10)
    second = make_request("b", PROMPT + FakeModel.tokens("xy"), n=2, max_tokens=10)
    engine.add(first)
    engine.add(second)
    out = Outputs()
    step_until(engine, out, lambda: second.status is RequestStatus.DECODING)
    budget = engine.scheduler.budget
    assert second.n_cached == len(PROMPT)  # it reads its own two tokens only
    assert budget.cells_reserved == len(PROMPT) + 2 * 10 + 2 + 2 * 10
    run(engine, out)
    assert out.tokens("b") == {i: expected(second.prompt, i, 10) for i in range(2)}
    assert books_empty(engine)


@pytest.mark.parametrize("how", ["abort", "error"])
def test_a_lender_ended_while_its_prompt_is_read_leaves_the_rest_to_its_borrower(
    how: str,
) -> None:
    engine, ctx = make_engine(n_batch=16)
    first = make_request("a", PROMPT, n=2, max_tokens=10)
    second = make_request("b", PROMPT + FakeModel.tokens("xy"), max_tokens=6)
    engine.add(first)
    engine.add(second)
    out = Outputs()
    step_until(engine, out, lambda: second.n_prefilled >= 16)  # borrowed as it was read
    assert first.status is RequestStatus.PREFILLING
    out.add(engine.abort("a") if how == "abort" else engine.fail([first], "a decode failed"))
    check_kv(engine)
    run(engine, out)
    assert out.tokens("b") == {0: expected(second.prompt, 0, 6)}
    assert books_empty(engine) and len(ctx.cells) == engine.scheduler.budget.cache.cells()


# -- drops and refills ------------------------------------------------------------------------


def test_a_dropped_branch_stops_at_once_and_the_others_go_on() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=3, max_tokens=12)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[1].tokens) >= 4)
    kept = len(parent.branches[1].tokens)
    reserved = engine.scheduler.budget.cells_reserved
    refilled, outputs = engine.drop("p", 1)
    # The room it did not use is free at once; the cells it holds stay its request's.
    assert engine.scheduler.budget.cells_reserved == reserved - (12 - (kept - 1))
    assert refilled is None and outputs[0].choices[0].finish_reason is FinishReason.DROPPED
    out.add(outputs)
    run(engine, out)
    assert out.reasons("p") == {0: "length", 1: "dropped", 2: "length"}
    tokens = out.tokens("p")
    assert tokens[1] == expected(PROMPT, 1, 12)[: len(tokens[1])] and len(tokens[1]) <= kept
    assert tokens[0] == expected(PROMPT, 0, 12) and tokens[2] == expected(PROMPT, 2, 12)
    assert out.last("p").completion_tokens == 24 + kept
    assert books_empty(engine)


@pytest.mark.parametrize("dropped", [0, 1])
def test_a_drop_while_the_prompt_is_read_hands_the_prompt_on(dropped: int) -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=6)
    engine.add(parent)
    out = Outputs()
    out.add(engine.step())
    assert parent.status is RequestStatus.PREFILLING and parent.n_prefilled > 0
    out.add(engine.drop("p", dropped)[1])
    check_kv(engine)
    run(engine, out)
    other = 1 - dropped
    assert out.tokens("p") == {other: expected(PROMPT, other, 6), dropped: []}
    assert out.reasons("p") == {dropped: "dropped", other: "length"}
    assert books_empty(engine)


def test_dropping_the_last_live_branch_ends_the_request_and_caches_its_cells() -> None:
    engine, ctx = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, max_tokens=40)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 5)
    _, outputs = engine.drop("p", 0)
    assert outputs[0].finished and parent.status is RequestStatus.FINISHED
    assert books_empty(engine)
    tokens = parent.branches[0].tokens
    assert [list(p.tokens) for p in engine.scheduler.budget.cache.paths] == [PROMPT + tokens[:-1]]
    assert len(ctx.cells) == engine.scheduler.budget.cache.cells()


@pytest.mark.parametrize("phase", ["prefilling", "decoding"])
def test_a_refill_starts_a_fresh_branch_from_the_prompt_under_a_new_index(phase: str) -> None:
    engine, _ = make_engine(n_batch=16, max_live=2)  # it takes the dropped one's place
    parent = make_request("p", PROMPT, n=2, max_tokens=10)
    engine.add(parent)
    out = Outputs()
    if phase == "prefilling":
        out.add(engine.step())
    else:
        step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 3)
    refill = fresh_branch(rank=4)
    index, outputs = engine.drop("p", 0, refill)
    assert index == 2 and refill.index == 2
    out.add(outputs)
    check_kv(engine)
    run(engine, out)
    assert out.tokens("p")[2] == expected(PROMPT, 4, 10)  # from the prompt's own cells
    assert out.reasons("p") == {0: "dropped", 1: "length", 2: "length"}
    assert books_empty(engine)


def test_a_refill_with_no_room_is_refused_and_changes_nothing() -> None:
    engine, _ = make_engine(n_ctx=200, n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=70)  # 57 + 140 of 200 cells
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: parent.status is RequestStatus.DECODING)
    refill = fresh_branch(rank=3)
    with pytest.raises(LiveRefused) as refused:
        engine.drop("p", 1, refill)
    assert refused.value.status == 429 and "KV cells" in refused.value.message
    assert isinstance(refill.sampler, FakeSampler) and refill.sampler.closed == 1
    assert len(parent.live) == 2 and len(parent.branches) == 2
    run(engine, out)
    assert out.reasons("p") == {0: "length", 1: "length"}
    assert books_empty(engine)


# -- steering ------------------------------------------------------------------------------


def test_a_steered_sampler_takes_the_branch_from_its_next_token_with_its_history() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, n=2, max_tokens=16)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 5)
    before = list(parent.branches[0].tokens)
    old, new = parent.branches[0].sampler, FakeSampler(rank=3)
    assert engine.steer("p", 0, new, []) == []
    run(engine, out)
    tokens = out.tokens("p")[0]
    assert tokens[: len(before)] == before
    assert tokens[len(before) :] == expected(PROMPT + before, 3, 16 - len(before))
    assert new.accepted == before  # penalties and grammars see the text so far
    assert isinstance(old, FakeSampler) and old.closed == 1
    assert out.tokens("p")[1] == expected(PROMPT, 1, 16)


def test_appended_words_are_decoded_into_the_branch_as_if_the_model_wrote_them() -> None:
    engine, _ = make_engine(n_batch=16)
    parent = make_request("p", PROMPT, max_tokens=16)
    engine.add(parent)
    out = Outputs()
    step_until(engine, out, lambda: len(parent.branches[0].tokens) >= 4)
    before, words = list(parent.branches[0].tokens), FakeModel.tokens("dog")
    engine.steer("p", 0, None, words)
    run(engine, out)
    tokens = out.tokens("p")[0]
    assert tokens[: len(before) + 3] == before + words  # sent on the stream, in step
    rest = 16 - len(before) - 3
    assert tokens[len(before) + 3 :] == expected(PROMPT + before + words, 0, rest)
    sampler = parent.branches[0].sampler
    assert isinstance(sampler, FakeSampler) and sampler.accepted == words
    assert spell(tokens).startswith(spell(before) + "dog")


# -- what may not be changed -----------------------------------------------------------------


def test_what_cannot_be_dropped_or_steered_is_refused_with_its_reason() -> None:
    engine, _ = make_engine(n_batch=16, max_live=2)
    running = make_request("r", PROMPT, n=2, max_tokens=30)
    queued = make_request("q", PROMPT[:20], n=2, max_tokens=4)
    engine.add(running)
    engine.add(queued)
    out = Outputs()
    step_until(engine, out, lambda: running.status is RequestStatus.DECODING)
    engine.drop("r", 0)

    def refusal(action: Callable[[], object]) -> tuple[int, str]:
        with pytest.raises(LiveRefused) as refused:
            action()
        return refused.value.status, refused.value.message

    assert refusal(lambda: engine.drop("q", 0))[0] == 409  # queued
    assert refusal(lambda: engine.drop("r", 0)) == (409, "choice 0 has ended (dropped)")
    assert refusal(lambda: engine.steer("r", 7, None, [3]))[0] == 404
    assert refusal(lambda: engine.steer("gone", 0, None, [3]))[0] == 409
    run(engine, out)
    greedy = make_request("g", PROMPT, n=1, max_tokens=9, temperature=0.0)
    copies = Request(
        "g",
        greedy.spec.__class__(**{**greedy.spec.__dict__, "n_choices": 3}),
        greedy.branches,
        greedy.times,
    )
    ranked = make_request("b", PROMPT, n=2, max_tokens=9)
    ranked.best_of = BestOf(1)
    for request in (copies, ranked):
        engine.add(request)
        engine.step()
        assert refusal(lambda r=request: engine.drop(r.request_id, 0))[0] == 409  # type: ignore[misc]
    run(engine, out)
    assert books_empty(engine)


# -- at every phase of a branch, with banned-phrase rewinds ---------------------------------------


def phrase_of_the_first_branch() -> str:
    return spell(expected(PROMPT, 0, 14))[4:7]


@pytest.mark.parametrize("at_step", range(0, 20))
def test_drop_refill_steer_and_fork_at_any_step_keep_the_books(at_step: int) -> None:
    """Steps 0-3 read the prompt, then branches decode, rewind over a banned phrase (branch
    0) and end: each action lands in a different phase, and the books hold after each."""
    engine, _ = make_engine(n_batch=16)
    request = banned_request(PROMPT, 3, (phrase_of_the_first_branch(),), max_tokens=14)
    engine.add(request)
    out = Outputs()
    for _ in range(at_step):
        out.add(engine.step())
        check_kv(engine)
    actions = [
        lambda: engine.drop("r", 1, fresh_branch(rank=5))[1],
        lambda: engine.steer("r", 0, FakeSampler(rank=2), FakeModel.tokens("ab")),
        lambda: engine.drop("r", 2)[1],
    ]
    for action in actions:
        try:
            out.add(action())
        except LiveRefused as refused:
            assert refused.status == 409  # queued, ended or finished: nothing changed
        check_kv(engine)
    if request.status is RequestStatus.DECODING:
        text = request.branches[0].tokens
        fork = make_request("f", PROMPT + text, n=2, max_tokens=3)
        engine.add(fork)
    run(engine, out)
    assert request.status is RequestStatus.FINISHED
    assert books_empty(engine)
    assert phrase_of_the_first_branch() not in out.text("r")[0]
    if "f" in out.by_request:
        assert len(out.tokens("f")) == 2


# -- the runtime's doorway ---------------------------------------------------------------------


def test_the_runtime_runs_a_live_action_on_the_engine_thread_and_returns_its_answer() -> None:
    """The actions are queued while the engine is held inside a decode (a gate on the fake
    context), so they run, in order, between that step and the next: the request cannot
    end first however slow the event loop is."""
    engine, ctx = make_engine(n_batch=16)
    gate, calls = threading.Event(), [0]
    decode = ctx.decode

    def gated(batch: Any) -> None:
        calls[0] += 1
        if calls[0] == 8:  # a few steps into decoding
            assert gate.wait(30), "the test never opened the gate"
        decode(batch)

    ctx.decode = gated  # type: ignore[method-assign]

    async def scenario() -> tuple[list[object], dict[int, str]]:
        runtime = Runtime(engine)
        runtime.start()
        try:
            generation = runtime.generate(
                Submission(make_request("p", PROMPT, n=2, max_tokens=300))
            )
            reasons: dict[int, str] = {}
            outputs = [await anext(generation)]
            while calls[0] < 8:  # the engine runs on to the gate and waits there
                await asyncio.sleep(0.01)
            actions = [
                runtime.drop("p", 0, Built(fresh_branch(rank=1))),
                runtime.steer("p", 0, None, [3]),  # dropped just before: refused
                runtime.drop("p", 1, None),
                runtime.drop("p", 2, None),  # the refill
            ]
            tasks = [asyncio.ensure_future(action) for action in actions]
            await asyncio.sleep(0.05)  # each task hands its work to the engine thread
            gate.set()
            answers = await asyncio.gather(*tasks, return_exceptions=True)
            outputs += [output async for output in generation]
            for output in outputs:
                for choice in output.choices:
                    if choice.finish_reason is not None:
                        reasons[choice.index] = choice.finish_reason
            return answers, reasons
        finally:
            gate.set()
            runtime.stop()

    answers, reasons = asyncio.run(scenario())
    assert answers[0] == 2 and isinstance(answers[1], LiveRefused)
    assert answers[2] is None and answers[3] is None
    assert reasons == {0: "dropped", 1: "dropped", 2: "dropped"}
    assert books_empty(engine)

"""The step budget: prompt chunks beside running streams are sized from measured timings,
and a prompt with nothing decoding beside it fills the batch. No model, no clock."""

from __future__ import annotations

from llama_srb.engine.pacing import MIN_CHUNK, PROBE_CHUNK, StepPacer
from tests.unit.fake_context import Outputs, make_engine, make_request, run
from tests.unit.test_scheduler import computed, make, scheduler, until_decoding


def test_no_streams_or_no_budget_means_a_full_batch() -> None:
    assert StepPacer(0.15).prefill_room(0, 512) == 512  # nothing decoding
    off = StepPacer(0.0)
    off.observe(4, 0, 0.03)
    off.observe(4, 508, 0.7)
    assert off.prefill_room(4, 508) == 508


def test_an_unmeasured_rate_starts_with_a_probe_chunk() -> None:
    assert StepPacer(0.15).prefill_room(4, 508) == PROBE_CHUNK


def test_the_chunk_fills_what_the_decode_step_leaves_of_the_budget() -> None:
    pacer = StepPacer(0.15)
    pacer.observe(4, 0, 0.03)  # streams alone: 30 ms a step
    pacer.observe(4, 100, 0.13)  # + 100 prompt tokens: 100 ms more, 1 ms each
    # 150 ms - 30 ms of decoding leaves 120 ms: 120 prompt tokens.
    assert pacer.prefill_room(4, 508) == 120
    assert pacer.prefill_room(4, 50) == 50  # never more than the batch has room for


def test_the_rate_follows_a_prompt_that_gets_slower_as_it_grows() -> None:
    pacer = StepPacer(0.15)
    pacer.observe(4, 0, 0.03)
    pacer.observe(4, 100, 0.13)
    before = pacer.prefill_room(4, 508)
    for _ in range(10):  # attention over a longer context: 2 ms a token now
        pacer.observe(4, 60, 0.03 + 60 * 0.002)
    assert pacer.prefill_room(4, 508) < before
    assert abs(pacer.prefill_room(4, 508) - 60) <= 2


def test_a_prompts_last_token_does_not_teach_the_rate() -> None:
    pacer = StepPacer(0.15)
    pacer.observe(4, 0, 0.03)
    pacer.observe(4, 100, 0.13)
    pacer.observe(0, 1, 0.03)  # mostly the fixed cost of a step: would read as 30 ms/token
    assert pacer.prefill_room(4, 508) == 120


def test_streams_that_fill_the_budget_alone_still_let_a_prompt_advance() -> None:
    pacer = StepPacer(0.1)
    pacer.observe(64, 0, 0.2)  # decoding alone takes twice the budget
    pacer.observe(64, 100, 0.25)  # reads as 0.625 ms a token (a quarter of the step, floored)
    # A quarter of the decode time, not of the budget: 50 ms of prompt, 80 tokens.
    assert pacer.prefill_room(64, 448) == 80
    pacer.observe(64, 0, 2.0)  # the steps grow (more streams): the prompt's share with them
    pacer.observe(64, 0, 2.0)
    assert pacer.prefill_room(64, 448) > 400


def test_a_tight_budget_still_moves_a_prompt_on() -> None:
    pacer = StepPacer(0.01)
    pacer.observe(4, 0, 0.009)
    pacer.observe(4, 20, 0.009 + 20 * 0.004)
    assert pacer.prefill_room(4, 508) == MIN_CHUNK


def test_the_scheduler_sizes_prefill_beside_streams_and_fills_the_batch_without() -> None:
    s = scheduler(n_batch=64)
    s.pacer = StepPacer(0.15)
    s.pacer.observe(2, 0, 0.03)
    s.pacer.observe(2, 30, 0.03 + 30 * 0.006)  # 6 ms a prompt token: 20 fit in 120 ms
    alone = make("alone", 200)
    s.add(alone)
    plan = computed(s, s.schedule())
    assert plan.prefill[0].end == 64  # nothing decodes: the whole batch
    until_decoding(s, alone)
    s.add(make("late", 200))
    plan = s.schedule()
    assert len(plan.decode) == 1
    assert [(c.start, c.end) for c in plan.prefill] == [(0, 20)]


def test_the_engine_teaches_the_pacer_from_its_decode_timings() -> None:
    engine, _ = make_engine(n_batch=64)
    engine.pacer.budget = 1.0  # the fake decodes in microseconds: everything fits
    out = Outputs()
    engine.add(make_request("stream", [1, 2, 3, 4], n=2, max_tokens=40, ignore_eos=True))
    for _ in range(3):
        out.add(engine.step())
    engine.add(make_request("long", [1] + [5] * 299, max_tokens=1))
    out.add(engine.step())
    assert engine.pacer.decode_seconds is not None and engine.pacer.token_seconds is not None
    run(engine, out)
    assert len(out.tokens("stream")[0]) == 40 and len(out.tokens("long")[0]) == 1

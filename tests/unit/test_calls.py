"""A step split into several llama_decode calls (--tokens-per-call): how rows are packed,
and that branches sample what one call per step gives them, each call sampled before the
next replaces its logits. No model."""

from __future__ import annotations

from llama_srb.config import Settings
from llama_srb.engine.request import FinishReason, Request, RequestStatus
from llama_srb.engine.scheduler import DecodeCall, PrefillChunk, StepPlan
from llama_srb.loader import CPU_TOKENS_PER_CALL, tokens_per_call
from llama_srb.native import has_gpu_device
from tests.unit.fake_context import Outputs, expected, make_engine, make_request, run
from tests.unit.test_engine import story
from tests.unit.test_scheduler import make


def rows(plan: DecodeCall) -> list[tuple[str, int]]:
    """(request id, tokens) per request or prompt chunk, in the call's order."""
    out: list[tuple[str, int]] = []
    for request, _ in plan.decode:
        if out and out[-1][0] == request.request_id:
            out[-1] = (request.request_id, out[-1][1] + 1)
        else:
            out.append((request.request_id, 1))
    return out + [(c.request.request_id, c.end - c.start) for c in plan.prefill]


def decoding(*requests: Request) -> list:
    return [(request, seq) for request in requests for seq in request.branches]


def test_calls_take_whole_requests_and_chunks_in_order_up_to_the_limit() -> None:
    a, b, c, d = make("a", 4, n=5), make("b", 4, n=3), make("c", 4, n=4), make("d", 30)
    plan = StepPlan(decode=decoding(a, b, c), prefill=[PrefillChunk(d, 0, 10)])
    assert [rows(call) for call in plan.calls(8)] == [
        [("a", 5), ("b", 3)],
        [("c", 4)],
        [("d", 10)],  # larger than the limit: a call of its own, never cut
    ]
    assert [rows(call) for call in plan.calls(14)] == [
        [("a", 5), ("b", 3), ("c", 4)],
        [("d", 10)],
    ]
    whole = DecodeCall(tuple(plan.decode), tuple(plan.prefill))
    assert plan.calls(0) == [whole] and plan.calls(22) == [whole]  # one call


def test_a_request_with_more_branches_than_the_limit_keeps_its_rows_together() -> None:
    wide, small = make("wide", 4, n=10), make("small", 4, n=2)
    plan = StepPlan(decode=decoding(small, wide))
    assert [rows(call) for call in plan.calls(8)] == [[("small", 2)], [("wide", 10)]]


PROMPTS = {f"r{i}": story(5 + 9 * i) for i in range(6)}


def serve(tokens_per_call: int) -> tuple[Outputs, int, int]:
    """Requests of 1 to 4 branches arriving over a few steps, some prompts long enough to
    be chunked beside decoding branches; returns the outputs, the engine's steps and its
    llama_decode calls."""
    engine, ctx = make_engine(n_batch=24, max_live=16, tokens_per_call=tokens_per_call)
    out = Outputs()
    for i, (rid, prompt) in enumerate(PROMPTS.items()):
        engine.add(make_request(rid, prompt, n=1 + i % 4, max_tokens=5 + i))
        out.add(engine.step())
    run(engine, out)
    return out, engine.stats.steps, ctx.calls


def test_calls_sample_what_one_call_per_step_does() -> None:
    one, steps, calls = serve(0)
    assert calls == steps
    split, steps, calls = serve(5)
    assert calls > steps  # the limit did split steps
    for i, (rid, prompt) in enumerate(PROMPTS.items()):
        want = {b: expected(prompt, b, 5 + i) for b in range(1 + i % 4)}
        assert one.tokens(rid) == split.tokens(rid) == want, rid
        assert split.reasons(rid) == {b: FinishReason.LENGTH for b in range(1 + i % 4)}


def test_a_failed_call_fails_its_own_requests_and_the_other_calls_go_on() -> None:
    engine, ctx = make_engine(n_batch=16, max_live=8, tokens_per_call=3)
    first = make_request("first", story(6), n=3, max_tokens=4)
    second = make_request("second", story(7), n=2, max_tokens=4)
    engine.add(first)
    engine.add(second)
    out = Outputs()
    while not all(r.status is RequestStatus.DECODING for r in (first, second)):
        out.add(engine.step())
    ctx.fail_next = 1  # the step's first call: the first request's three rows
    out.add(engine.step())
    assert out.last("first").error is not None and "code 1" in out.last("first").error
    assert out.reasons("first") == {i: FinishReason.ERROR for i in range(3)}
    run(engine, out)
    assert out.tokens("second") == {b: expected(second.prompt, b, 4) for b in range(2)}
    assert out.last("second").error is None


def test_by_default_calls_stay_below_the_cpu_tile_unless_layers_are_offloaded() -> None:
    assert tokens_per_call(Settings(tokens_per_call=5)) == 5
    assert tokens_per_call(Settings(tokens_per_call=0)) == 0
    assert tokens_per_call(Settings(n_gpu_layers=0)) == CPU_TOKENS_PER_CALL  # nothing offloaded
    offloaded = has_gpu_device()  # a CUDA (or RPC) build on a machine with the device
    assert tokens_per_call(Settings()) == (0 if offloaded else CPU_TOKENS_PER_CALL)

"""The sampling stage (engine/sampling_stage.py) over the fake context: one decode call in,
the token of every branch it carries out, in plan order; a prompt's last row serves all
its branches; a grammar past its limit stops its request's branches, not the others';
prompt scores are written; every row the host reads is counted once, whole."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from llama_srb.engine.engine import Engine
from llama_srb.engine.sampling_stage import CallSample
from llama_srb.engine.scheduler import DecodeCall
from llama_srb.sampling.masks import Bitmask
from tests.unit.fake_context import (
    BOS,
    N_VOCAB,
    expected,
    make_engine,
    make_request,
    run,
)

ROW_BYTES = N_VOCAB * 4  # one float32 row of the fake vocabulary


def story(salt: int, length: int = 12) -> list[int]:
    return [BOS, *[2 + (salt * 7 + i * (salt % 5 + 1)) % 26 for i in range(length - 1)]]


def next_call(
    engine: Engine, masks: dict[int, Bitmask] | None = None
) -> tuple[DecodeCall, CallSample]:
    """Plan steps until one has a call with rows to sample; decode that call and run the
    stage over it (as Engine._run does), returning both."""
    for _ in range(50):
        plan = engine.scheduler.schedule()
        engine._apply(plan.kv_ops)
        for call in plan.calls(0):
            rows, _ = engine._decode(call)
            engine._apply(engine.scheduler.prefilled(call))
            sampled = call.decode or any(c.completes_prompt for c in call.prefill)
            if sampled:
                return call, engine.sampling.run(call, rows, masks or {})
    raise AssertionError("no call sampled")


def test_a_prompt_s_last_row_gives_every_branch_its_first_token_read_once() -> None:
    engine, _ = make_engine(n_batch=64)
    prompt = story(1)
    request = make_request("a", prompt, n=3, max_tokens=4)
    engine.add(request)
    before = engine.stats.logits_bytes_read
    call, out = next_call(engine)
    assert [c.completes_prompt for c in call.prefill] == [True]
    assert [(r.request_id, d.index) for r, d in out.deltas] == [("a", 0), ("a", 1), ("a", 2)]
    firsts = {i: expected(prompt, i, 1)[0] for i in range(3)}
    assert {b.index: out.drawn[id(b)] for b in request.branches} == firsts
    assert [d.token_ids for _, d in out.deltas] == [[firsts[i]] for i in range(3)]
    assert out.rewinds == [] and out.broken == []
    assert engine.stats.logits_bytes_read - before == ROW_BYTES  # one row for three branches


def test_decode_rows_are_sampled_in_the_call_s_order_one_row_each() -> None:
    engine, _ = make_engine(n_batch=64)
    prompts = {"a": story(2), "b": story(3)}
    for name, prompt in prompts.items():
        engine.add(make_request(name, prompt, n=2, max_tokens=6))
    for _ in range(2):  # each prompt's first tokens (one at a time on an idle server)
        next_call(engine)
    before = engine.stats.logits_bytes_read
    call, out = next_call(engine)
    assert len(call.decode) == 4
    order = [(r.request_id, b.index) for r, b in call.decode]
    assert [(r.request_id, d.index) for r, d in out.deltas] == order
    for request, branch in call.decode:
        want = expected(prompts[request.request_id], branch.index, len(branch.tokens))
        assert branch.tokens == want
        assert out.drawn[id(branch)] == want[-1]
    assert engine.stats.logits_bytes_read - before == 4 * ROW_BYTES


def test_a_grammar_past_its_limit_stops_its_request_and_no_other() -> None:
    engine, _ = make_engine(n_batch=64)
    good, bad = make_request("good", story(4), max_tokens=4), make_request("bad", story(5))
    engine.add(good)
    engine.add(bad)
    for _ in range(2):
        next_call(engine)
    broken = SimpleNamespace(error="too much work")
    bad.branches[0].sampler.matcher = broken  # type: ignore[union-attr]
    masks = {id(bad.branches[0]): np.full(1, -1, np.int32)}
    had = list(bad.branches[0].tokens)
    call, out = next_call(engine, masks)
    assert {r.request_id for r, _ in call.decode} == {"good", "bad"}
    assert [r.request_id for r, _ in out.deltas] == ["good"]
    assert [(r.request_id, e) for r, e in out.broken] == [
        ("bad", "the grammar cannot go on: too much work")
    ]
    assert bad.branches[0].tokens == had  # it drew nothing


def test_echo_with_logprobs_scores_every_prompt_row_and_counts_them() -> None:
    engine, _ = make_engine(n_batch=64)
    prompt = story(6)
    request = make_request("e", prompt, max_tokens=1, logprobs=1)
    request.spec = replace(request.spec, prompt_logprobs=True)  # echo
    engine.add(request)
    run(engine)
    scores = request.prompt_scores
    assert scores[0] is None and len(scores) == len(prompt)
    assert all(s is not None and s.token == t for s, t in zip(scores[1:], prompt[1:], strict=True))
    # every prompt row but the last was scored; the last also gave the first token
    assert engine.stats.logits_bytes_read == len(prompt) * ROW_BYTES


def test_the_engine_counts_a_row_per_branch_step_and_publishes_it() -> None:
    engine, _ = make_engine(n_batch=64)
    engine.add(make_request("c", story(7), n=2, max_tokens=5))
    out = run(engine)
    assert {len(t) for t in out.tokens("c").values()} == {5}
    rows = 1 + 2 * 4  # the prompt's last row for both, then one row per branch and token
    assert engine.stats.logits_bytes_read == rows * ROW_BYTES
    engine.publish_snapshot()
    assert engine.snapshot.stats.logits_bytes_read == rows * ROW_BYTES

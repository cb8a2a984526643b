"""Choosing between branches without a model: best_of's ranking and distinct openings over
the fake context, per-branch settings' validation, and the real llama.cpp samplers'
opening draw and history rewind on synthetic rows."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import cast

import llama_cpp as C
import numpy as np
import numpy.typing as npt
import pytest

from llama_srb.engine.best_of import BestOf, mean_logprob
from llama_srb.engine.request import Branch, FinishReason, Request
from llama_srb.native import Model
from llama_srb.sampling.branch import BranchSampler, build_samplers, most_likely_untaken
from llama_srb.sampling.cut import Row
from llama_srb.sampling.params import ParamError, SamplingParams
from llama_srb.sampling.text import TextStream
from tests.unit.fake_context import BOS, FakeModel, bare_request, expected, make_engine, run
from tests.unit.test_banned import RewindingSampler

PROMPT = [BOS, *FakeModel.tokens("thestorybegins")]


def fake_request(n: int, ranks: list[int], **params: object) -> Request:
    stop = SamplingParams(**params).stop  # type: ignore[arg-type]
    branches = [
        Branch(index=i, sampler=RewindingSampler(ranks[i]), text=TextStream(FakeModel.piece, stop))
        for i in range(n)
    ]
    return bare_request("r", PROMPT, branches, **params)


# -- best_of ----------------------------------------------------------------------------


def test_best_of_returns_the_n_best_by_mean_logprob_best_first() -> None:
    engine, _ = make_engine(n_batch=16)
    request = fake_request(4, [3, 0, 2, 1], max_tokens=5)
    request.best_of = BestOf(2)
    engine.add(request)
    out = run(engine)
    # nothing before the end: best_of is never streamed
    assert all(not o.choices for o in out.by_request["r"][:-1])
    last = out.last("r")
    assert [c.index for c in last.choices] == [0, 1]
    # Branch 1 picks the most likely token every time, branch 3 the second most likely.
    assert last.choices[0].token_ids == expected(PROMPT, 0, 5)
    assert last.choices[1].token_ids == expected(PROMPT, 1, 5)
    assert [c.finish_reason for c in last.choices] == [FinishReason.LENGTH] * 2
    assert last.completion_tokens == 20  # every generated token, returned or not
    means = [mean_logprob(s) for s in request.branches]
    assert means[1] > means[3] > max(means[0], means[2])
    assert all(len(s.scores) == 5 for s in request.branches)


def test_best_of_with_logprobs_returns_the_chosen_branches_logprobs() -> None:
    engine, _ = make_engine(n_batch=16)
    request = fake_request(3, [2, 1, 0], max_tokens=4, logprobs=1)
    request.best_of = BestOf(1)
    engine.add(request)
    (choice,) = run(engine).last("r").choices
    assert choice.index == 0 and choice.token_ids == expected(PROMPT, 0, 4)
    assert choice.logprobs is not None
    mean = sum(e.logprob for e in choice.logprobs) / 4
    assert math.isclose(mean, mean_logprob(request.branches[2]))


# -- distinct openings over the fake ----------------------------------------------------


def test_distinct_openings_give_every_branch_its_own_first_token() -> None:
    engine, _ = make_engine(n_batch=16)
    request = fake_request(8, [0] * 8, max_tokens=3, distinct_openings=True)
    engine.add(request)
    tokens = run(engine).tokens("r")
    firsts = [tokens[i][0] for i in range(8)]
    assert len(set(firsts)) == 8
    assert firsts[0] == expected(PROMPT, 0, 1)[0]  # the first branch draws as usual
    without = fake_request(8, [0] * 8, max_tokens=3)
    engine.add(without)
    same = run(engine).tokens("r")
    assert len({same[i][0] for i in range(8)}) == 1


# -- choices_params ---------------------------------------------------------------------


def test_choices_params_override_a_branch_and_are_checked_like_the_fields() -> None:
    params = SamplingParams(
        temperature=0.8,
        choices_params=[{"temperature": 0}, {"temperature": 1.5, "xtc_probability": 0.5}],
    )
    assert params.for_branch(0).greedy
    assert params.for_branch(1).temperature == 1.5 and params.for_branch(1).xtc_probability == 0.5
    assert params.for_branch(2) is params  # no entry: the request's own settings
    bad = [
        ([{"temperature": 500}], "choices_params[0].temperature"),
        ([{}, {"max_tokens": 4}], "choices_params[1].max_tokens"),
        ([{"top_k": True}], "choices_params[0].top_k"),
        ([{"dry_sequence_breakers": "x"}], "choices_params[0].dry_sequence_breakers"),
        (["hot"], "choices_params[0]"),
    ]
    for entries, param in bad:
        with pytest.raises(ParamError) as info:
            SamplingParams(choices_params=entries)  # type: ignore[arg-type]
        assert info.value.param == param
    SamplingParams(choices_params=[{}, {"top_k": 9}]).check_model_limits(50, 100)
    with pytest.raises(ParamError) as info:
        SamplingParams(choices_params=({}, {"top_k": 99})).check_model_limits(50, 100)  # type: ignore[arg-type]
    assert info.value.param == "choices_params[1].top_k"


def test_banned_strings_are_bounded() -> None:
    with pytest.raises(ParamError) as info:
        SamplingParams(banned_strings=("",))
    assert info.value.param == "banned_strings"
    with pytest.raises(ParamError):
        SamplingParams(banned_strings=("x" * 257,))


# -- llama.cpp's samplers on synthetic rows ----------------------------------------------

N_VOCAB = 64


@dataclass(frozen=True)
class Vocab64:
    """What building samplers reads of a model, for a 64-token vocabulary (no DRY)."""

    n_vocab: int = N_VOCAB
    n_ctx_train: int = 4096
    vocab: None = None


def sampler_for(params: SamplingParams, seed: int = 0) -> BranchSampler:
    (sampler,) = build_samplers(cast(Model, Vocab64()), params, [seed])
    assert isinstance(sampler, BranchSampler)
    return sampler


def row() -> npt.NDArray[np.float32]:
    """Token t has logit -t: 0 is the most likely, then 1, 2, ..."""
    return -np.arange(N_VOCAB, dtype=np.float32)


def test_an_opening_is_drawn_from_the_filtered_tokens_not_yet_taken() -> None:
    top3 = SamplingParams(top_k=3, top_p=1.0, min_p=0.0, temperature=1.0)
    seen = set()
    for seed in range(40):
        sampler = sampler_for(top3, seed)
        seen.add(sampler.sample(Row(row()), taken={0}))
        sampler.close()
    assert seen == {1, 2}  # never the taken one, never past the filter
    sampler = sampler_for(top3, 1)
    # Fewer than the branches survive: the most likely token not taken, past the filter.
    assert sampler.sample(Row(row()), taken={0, 1, 2}) == 3
    sampler.close()


def test_a_greedy_opening_takes_the_most_likely_untaken_token() -> None:
    sampler = sampler_for(SamplingParams(temperature=0))
    assert sampler.sample(Row(row()), taken=set()) == 0
    assert sampler.sample(Row(row()), taken={0, 1}) == 2
    sampler.close()
    assert most_likely_untaken(row(), {0, 2}) == 1


def test_an_opening_after_xtc_reads_the_moved_survivors() -> None:
    # XTC drops the top tokens above its threshold by moving the array's start.
    params = SamplingParams(
        top_k=6, top_p=1.0, min_p=0.0, temperature=1.0, xtc_probability=1.0, xtc_threshold=0.01
    )
    flat = np.zeros(N_VOCAB, dtype=np.float32)
    flat[:4] = 5.0  # four likely tokens; XTC keeps only the least likely of them and the rest
    for seed in range(10):
        sampler = sampler_for(params, seed)
        token = sampler.sample(Row(flat.copy()), taken={3})
        assert token != 3 and 0 <= token < N_VOCAB
        sampler.close()


def penalized(sampler: C.llama_sampler_p) -> npt.NDArray[np.float32]:
    data = np.zeros(N_VOCAB, [("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    data["id"] = np.arange(N_VOCAB)
    data["logit"] = 1.0
    array = C.llama_token_data_array(
        data=data.ctypes.data_as(C.llama_token_data_p), size=N_VOCAB, selected=-1, sorted=False
    )
    C.llama_sampler_apply(sampler, ctypes.byref(array))
    return data["logit"].copy()


def test_a_rewind_leaves_the_penalties_as_if_only_the_kept_tokens_were_seen() -> None:
    params = SamplingParams(
        temperature=0, repeat_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.5
    )
    rewound, fresh = sampler_for(params), sampler_for(params)
    for token in [5, 6, 7, 8, 9]:
        rewound.accept(token)
    rewound.rewind([5, 6])
    for token in [5, 6]:
        fresh.accept(token)
    assert rewound.head is not None and fresh.head is not None
    got = penalized(C.llama_sampler_chain_get(rewound.head.ptr, 0))
    want = penalized(C.llama_sampler_chain_get(fresh.head.ptr, 0))
    assert np.array_equal(got, want) and got[7] == 1.0 and got[5] < 1.0
    # ... and so does the next token: 5 and 6 are penalized, 7 is not
    flat = np.zeros(N_VOCAB, dtype=np.float32)
    flat[[5, 6, 7]] = 1.0
    assert rewound.sample(Row(flat)) == 7
    rewound.close()
    fresh.close()

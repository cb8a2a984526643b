"""Every sampler and order on the fast path (head → cut → finish, sampling/branch.py)
against llama.cpp's own chain over the whole vocabulary, from the same real logits rows of
each bundled model: the same candidates left for the pick, with the same probabilities,
and the same greedy token. The rows are the model's own next-token rows over a story."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import llama_cpp as C
import numpy as np
import numpy.typing as npt
import pytest

from llama_srb.bundled_model import bundled_model_path
from llama_srb.native import Batch, Context, ContextOptions, Model
from llama_srb.sampling.branch import BranchSampler, Candidates, build_samplers
from llama_srb.sampling.chain import CutKind, build, chain_order, plan_chain
from llama_srb.sampling.cut import Row
from llama_srb.sampling.params import SamplingParams

STORY = (
    "The lighthouse keeper found a letter on the rocks. It said: come to the harbour at"
    " dawn, and bring the key your father left you. Mara read it twice, folded it into her"
    " coat, and climbed the steps to light the lamp. The sea below was never quiet."
)


@dataclass
class Rows:
    model: Model
    rows: list[npt.NDArray[np.float32]]
    history: list[int]  # generated tokens the remembering samplers have seen
    eog: npt.NDArray[np.int64]


@pytest.fixture(scope="module")
def real(bundled_model: str) -> Iterator[Rows]:
    model = Model(bundled_model_path(bundled_model))
    ctx = Context(model, ContextOptions(n_ctx=1024, n_seq_max=2, n_batch=256))
    tokens = model.tokenize(STORY)[:96]
    batch = Batch(256)
    batch.add_span(tokens, 0, 0, True, logits_all=True)
    ctx.decode(batch)
    logits = ctx.logits()
    picked = [logits[i].copy() for i in range(10, len(tokens), 12)]  # flat and peaked rows
    # A history that repeats a phrase, so that DRY has something to penalize.
    phrase = tokens[20:26]
    history = [*phrase, *tokens[40:44], *phrase[:4]]
    eog = np.unique(np.array(model.eog_tokens, np.int64))
    yield Rows(model, picked, history, eog)
    batch.close()
    ctx.close()
    model.close()


def llama_cpp_candidates(
    rows: Rows, params: SamplingParams, row: npt.NDArray[np.float32], forbidden: bool
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """llama.cpp's chain (bias first, no pick) over every token of the row."""
    (chain,) = build(rows.model, params, chain_order(params), [7], pick=False, bias=True)
    for token in rows.history:
        C.llama_sampler_accept(chain.ptr, token)
    values = row.copy()
    if forbidden:
        values[rows.eog] = -np.inf
    _, kept = Candidates().run(chain, np.arange(len(values)), values, ordered=False)
    chain.close()
    return kept["id"].astype(np.int64), kept["logit"].copy()


def fast_candidates(
    rows: Rows, params: SamplingParams, row: npt.NDArray[np.float32], forbidden: bool
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    (sampler,) = build_samplers(rows.model, params, [7])
    assert isinstance(sampler, BranchSampler)
    for token in rows.history:
        sampler.accept(token)
    kept = sampler.filtered(Row(row.copy()), rows.eog if forbidden else None)
    sampler.close()
    return kept


def probabilities(ids: npt.NDArray[np.int64], logits: npt.NDArray[np.float32]) -> dict[int, float]:
    finite = np.isfinite(logits)
    e = np.exp(logits[finite].astype(np.float64) - logits[finite].max())
    return dict(zip(ids[finite].tolist(), (e / e.sum()).tolist(), strict=True))


ORDER_ST_112 = ("top_k", "typ_p", "top_p", "min_p", "temperature")  # SillyTavern 1.12.6's
ORDER_ST_119 = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "xtc", "top_p", "min_p")
CASES: dict[str, dict[str, object]] = {
    "defaults": {},
    "top_k 1": {"top_k": 1},
    "top_k 2000": {"top_k": 2000, "top_p": 1.0, "min_p": 0.0},
    "min_p first": {"top_k": 0, "top_p": 1.0, "min_p": 0.05},
    "top_p then min_p (SillyTavern's default)": {"top_k": 0, "top_p": 0.95, "min_p": 0.01},
    "top_p alone": {"top_k": 0, "top_p": 0.9, "min_p": 0.0},
    "top_p then top_k": {"top_k": 30, "top_p": 0.8, "sampler_order": ("top_p", "top_k")},
    "typical after top_k": {"typical_p": 0.9},
    "typical first": {"top_k": 0, "typical_p": 0.8, "top_p": 1.0, "min_p": 0.0},
    "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.02, "top_k": 100},
    "top_n_sigma first": {"top_n_sigma": 1.5},
    "temperature first": {
        "temperature": 1.7,
        "top_k": 0,
        "min_p": 0.1,
        "sampler_order": ("temperature", "min_p", "top_p"),
    },
    "dynamic temperature": {"dynatemp_range": 0.5, "temperature": 1.1},
    "dynamic temperature first": {
        "dynatemp_range": 0.5,
        "sampler_order": ("temperature", "top_k", "min_p"),
    },
    "penalties": {"repeat_penalty": 1.3, "frequency_penalty": 0.4, "presence_penalty": 0.6},
    "DRY": {"dry_multiplier": 1.5, "dry_allowed_length": 1},
    "penalties after the cut": {
        "repeat_penalty": 2.0,
        "sampler_order": ("top_k", "penalties", "temperature"),
    },
    # one token lifted into every row's top (twice: llama.cpp adds repeats), a thousand
    # common ones banned
    "logit bias": {"logit_bias": ((13, 20.0), *((t, -100.0) for t in range(100, 1100)), (13, 5.0))},
    "every token (no filter)": {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.3},
    "SillyTavern 1.12 order": {
        "top_k": 0,
        "top_p": 0.9,
        "min_p": 0.02,
        "sampler_order": ORDER_ST_112,
    },
    "SillyTavern 1.19 order": {
        "top_k": 0,
        "repeat_penalty": 1.1,
        "dry_multiplier": 0.8,
        "top_p": 0.95,
        "min_p": 0.01,
        "sampler_order": ORDER_ST_119,
    },
}


@pytest.mark.parametrize("forbidden", [False, True], ids=["", "eog masked"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_fast_path_leaves_llama_cpps_candidates(real: Rows, case: str, forbidden: bool) -> None:
    params = SamplingParams(**CASES[case])  # type: ignore[arg-type]
    for row in real.rows:
        want = probabilities(*llama_cpp_candidates(real, params, row, forbidden))
        got = probabilities(*fast_candidates(real, params, row, forbidden))
        assert same_cut(got, want), f"{case}: {plan_chain(params)}"
        common = got.keys() & want.keys()
        got, want = renormalized(got, common), renormalized(want, common)
        for token, p in want.items():
            assert got[token] == pytest.approx(p, rel=1e-4, abs=1e-7), (case, token)


def same_cut(got: dict[int, float], want: dict[int, float]) -> bool:
    """The same candidates, or a top-p cut deep in the tail placed a few tokens apart:
    llama.cpp sums its probabilities in float32, one after the other (1,256 tokens
    where the exact cut keeps 1,258 at p = 0.9 on a SmolLM2 row). Then one set is the
    other and the next most likely tokens, which hold under 1e-3 of its mass."""
    if got.keys() == want.keys():
        return True
    small, large = sorted((got, want), key=len)
    extra = large.keys() - small.keys()
    return (
        small.keys() <= large.keys()
        and max(large[t] for t in extra) <= min(large[t] for t in small)
        and sum(large[t] for t in extra) < 1e-3
    )


def renormalized(probs: dict[int, float], tokens: set[int]) -> dict[int, float]:
    total = sum(probs[t] for t in tokens)
    return {t: probs[t] / total for t in tokens}


@pytest.mark.parametrize(
    "settings",
    [{}, {"repeat_penalty": 1.5, "dry_multiplier": 1.0, "logit_bias": ((5, 30.0),)}],
    ids=["plain", "penalties, DRY and bias"],
)
def test_greedy_picks_llama_cpps_token(real: Rows, settings: dict[str, object]) -> None:
    params = SamplingParams(temperature=0, **settings)  # type: ignore[arg-type]
    assert plan_chain(params).cut is CutKind.GREEDY
    for row in real.rows:
        (chain,) = build(real.model, params, chain_order(params), [0], pick=True, bias=True)
        (sampler,) = build_samplers(real.model, params, [0])
        for token in real.history:
            sampler.accept(token)
            C.llama_sampler_accept(chain.ptr, token)
        want, _ = Candidates().run(chain, np.arange(len(row)), row.copy(), ordered=False)
        assert sampler.sample(Row(row.copy())) == want
        chain.close()
        sampler.close()


def test_every_case_takes_the_path_the_docs_name(real: Rows) -> None:
    """The fast cut where docs/sampling.md says so; llama.cpp over every token elsewhere."""
    whole = {"typical first", "top_n_sigma first", "dynamic temperature first"}
    for case, settings in CASES.items():
        kind = plan_chain(SamplingParams(**settings)).cut  # type: ignore[arg-type]
        assert (kind is CutKind.WHOLE) == (case in whole), (case, kind)

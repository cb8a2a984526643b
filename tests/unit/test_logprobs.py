"""Log-probability math: what the engine computes for logprobs requests, read through a
row's column maxima (sampling/cut.py), on rows shorter and longer than one column."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llama_srb.sampling.cut import Row
from llama_srb.sampling.logprobs import RowScores

ROW = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
REFERENCE = [x - math.log(sum(math.exp(v) for v in ROW.tolist())) for x in ROW.tolist()]


def scores(row: np.ndarray, k: int) -> RowScores:
    return RowScores(Row(row), k)


def test_token_logprob_is_the_log_softmax() -> None:
    for token, expected in enumerate(REFERENCE):
        assert scores(ROW, 0).entry(token).logprob == pytest.approx(expected, abs=1e-6)


def test_the_normalizer_survives_huge_logits() -> None:
    big = np.array([1000.0, 1000.0], dtype=np.float32)
    assert scores(big, 0).lse == pytest.approx(1000.0 + math.log(2.0))


def test_probabilities_sum_to_one_over_a_row_of_many_columns() -> None:
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(64 * 40 + 7) * 4).astype(np.float32)  # 40 columns and a tail
    row_scores = scores(row, 0)
    total = sum(math.exp(row_scores.entry(t).logprob) for t in range(len(row)))
    assert total == pytest.approx(1.0, abs=1e-5)


def test_top_k_is_most_likely_first_with_the_same_logprobs() -> None:
    top = scores(ROW, 3).top
    assert [t for t, _ in top] == [3, 0, 2]
    assert [lp for _, lp in top] == pytest.approx([REFERENCE[3], REFERENCE[0], REFERENCE[2]])
    assert scores(ROW, 0).top == ()
    assert len(scores(ROW, 50).top) == len(ROW)  # k larger than the vocabulary


def test_top_k_over_many_columns_matches_a_sort() -> None:
    rng = np.random.default_rng(1)
    row = (rng.standard_normal(64 * 100) * 3).astype(np.float32)
    top = scores(row, 20).top
    assert [t for t, _ in top] == [int(t) for t in np.argsort(-row, kind="stable")[:20]]


def test_the_entry_reads_the_models_logit_not_a_samplers_change() -> None:
    row = Row(ROW.copy())
    row_scores = RowScores(row, 2)
    row.patch(np.array([0, 3]), np.array([-np.inf, 9.0], np.float32))  # a sampler's head
    row.restore()  # undone before the sampled token is scored, as BranchSampler does
    entry = row_scores.entry(0)
    assert entry.logprob == pytest.approx(REFERENCE[0])
    assert entry.top[0] == (3, pytest.approx(REFERENCE[3]))

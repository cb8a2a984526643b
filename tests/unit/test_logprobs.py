"""Log-probability math on small arrays: what the engine computes for logprobs requests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llama_srb.sampling.logprobs import RowScores, logsumexp, score_token, top_k

ROW = np.array([2.0, -1.0, 0.5, 3.0, 0.0], dtype=np.float32)
REFERENCE = [x - math.log(sum(math.exp(v) for v in ROW.tolist())) for x in ROW.tolist()]


def test_logsumexp_matches_the_definition_and_survives_huge_logits() -> None:
    assert logsumexp(ROW) == pytest.approx(math.log(sum(math.exp(v) for v in ROW.tolist())))
    big = np.array([1000.0, 1000.0], dtype=np.float32)
    assert logsumexp(big) == pytest.approx(1000.0 + math.log(2.0))


def test_token_logprob_is_the_log_softmax() -> None:
    for token, expected in enumerate(REFERENCE):
        assert score_token(ROW, token, 0).logprob == pytest.approx(expected, abs=1e-6)


def test_probabilities_sum_to_one() -> None:
    total = sum(math.exp(score_token(ROW, t, 0).logprob) for t in range(len(ROW)))
    assert total == pytest.approx(1.0, abs=1e-6)


def test_top_k_is_most_likely_first_with_the_same_logprobs() -> None:
    lse = logsumexp(ROW)
    top = top_k(ROW, 3, lse)
    assert [t for t, _ in top] == [3, 0, 2]
    assert [lp for _, lp in top] == pytest.approx([REFERENCE[3], REFERENCE[0], REFERENCE[2]])
    assert top_k(ROW, 0, lse) == ()
    assert len(top_k(ROW, 50, lse)) == len(ROW)  # k larger than the vocabulary


def test_scores_read_before_the_row_is_masked_stay_the_models() -> None:
    row = ROW.copy()
    scores = RowScores(row, 2)
    row[3] = -np.inf  # what the engine's EOG mask does after scoring
    entry = scores.entry(0)
    assert entry.logprob == pytest.approx(REFERENCE[0])
    assert entry.top[0] == (3, pytest.approx(REFERENCE[3]))

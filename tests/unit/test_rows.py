"""The C loops of sampling/_rows.c against numpy's float64 and brute force: the normalizer's
sum, the k largest, and top-p's head threshold, on rows of every shape the cuts give them
(a vocabulary that is no multiple of the vector width, -inf refusals, ties, one token).
Row.mask has tests/unit/test_masks.py."""

from __future__ import annotations

import numpy as np
import pytest

from llama_srb.sampling import _rows

SIZES = (1, 63, 64, 4095, 4096 * 64 + 17)


def row(n: int, seed: int = 0, refused: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(n) * 3).astype(np.float32)
    values[rng.random(n) < refused] = -np.inf
    return values


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("scale", [1.0, 0.4, 2.5])
@pytest.mark.parametrize("refused", [0.0, 0.5])
def test_exp_sum_is_the_float64_sum_to_a_millionth(n: int, scale: float, refused: float) -> None:
    values = row(n, refused=refused)
    values[0] = 1.0  # one finite token at least
    top = float(values.max())
    exact = np.exp((values.astype(np.float64) - top) * scale).sum()
    assert _rows.exp_sum(values, top, scale) == pytest.approx(exact, rel=1e-6)


def test_exp_sum_reads_a_grid_of_columns_and_counts_the_far_tail_as_nothing() -> None:
    grid = row(64 * 40).reshape(64, 40)
    assert _rows.exp_sum(grid, float(grid.max()), 1.0) == pytest.approx(
        np.exp(grid.astype(np.float64) - grid.max()).sum(), rel=1e-6
    )
    far = np.array([0.0, -200.0, -np.inf], np.float32)  # exp(-200) is below float32's range
    assert _rows.exp_sum(far, 0.0, 1.0) == 1.0


@pytest.mark.parametrize("n", SIZES[1:])
@pytest.mark.parametrize("k", [1, 40, 1000])
@pytest.mark.parametrize("refused", [0.0, 0.9])
def test_top_k_finds_the_k_largest(n: int, k: int, refused: float) -> None:
    k = min(k, n)
    values = row(n, seed=k, refused=refused)
    out = np.empty(k, np.intp)
    _rows.top_k(values, out)
    assert len(set(out.tolist())) == k
    assert np.array_equal(np.sort(values[out]), np.sort(values)[-k:])


def test_top_k_keeps_the_first_of_equals_and_refuses_a_wrong_buffer() -> None:
    values = np.array([1, 3, 3, 3, 2], np.float32)
    out = np.empty(2, np.intp)
    _rows.top_k(values, out)
    assert sorted(out.tolist()) == [1, 2]
    with pytest.raises(ValueError, match="longer than values"):
        _rows.top_k(values, np.empty(6, np.intp))
    with pytest.raises(ValueError, match="int64"):
        _rows.top_k(values, np.empty(2, np.int32))
    with pytest.raises(ValueError, match="float32"):
        _rows.top_k(values.astype(np.float64), out)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _rows.top_k(np.zeros((4, 4), np.float32)[:, 1], out)


def head_by_sorting(values: np.ndarray, top: float, scale: float, target: float) -> float:
    maxima = np.sort(values[values > -np.inf])[::-1]
    if not len(maxima):
        return -np.inf
    cumulative = np.cumsum(np.exp((maxima.astype(np.float64) - top) * scale))
    return float(maxima[min(int(np.searchsorted(cumulative, target)), len(maxima) - 1)])


@pytest.mark.parametrize("n", [1, 64, 4096])
@pytest.mark.parametrize("share", [0.0, 0.3, 0.9, 0.999, 2.0])
@pytest.mark.parametrize("refused", [0.0, 0.5])
def test_head_is_where_the_sorted_maxima_reach_the_target(
    n: int, share: float, refused: float
) -> None:
    values = row(n, seed=n, refused=refused)
    values[-1] = 0.5
    top, scale = float(values.max()), 0.8
    total = float(np.exp((values[values > -np.inf].astype(np.float64) - top) * scale).sum())
    # a target between two partial sums: float rounding cannot move the answer
    sums = np.cumsum(np.exp((np.sort(values[values > -np.inf])[::-1] - top) * scale))
    target = share * total
    at = int(np.searchsorted(sums, target))
    if 0 < at < len(sums):
        target = (sums[at - 1] + sums[at]) / 2
    expected = head_by_sorting(values, top, scale, target)
    assert _rows.head(values, top, scale, target) == expected


def test_head_of_nothing_finite_is_minus_infinity() -> None:
    assert _rows.head(np.full(8, -np.inf, np.float32), 0.0, 1.0, 0.5) == -np.inf

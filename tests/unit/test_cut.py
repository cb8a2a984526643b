"""The cuts over a whole row (sampling/cut.py) against brute force on synthetic rows: the
same survivors as sorting every token, bounds that hold, draws from the right
distribution, and patches that leave no trace."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from llama_srb.sampling import cut as cut_module
from llama_srb.sampling.cut import Row, grid_rows, top_p

Vector = npt.NDArray[np.float32]


def rows(n_vocab: int = 64 * 512, count: int = 12, seed: int = 0) -> list[Vector]:
    """Rows shaped like a language model's: a few likely tokens over a long heavy tail."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        row = rng.standard_normal(n_vocab).astype(np.float32) * 2.5
        peaks = rng.choice(n_vocab, 20, replace=False)
        row[peaks] += rng.uniform(4, 12, len(peaks)).astype(np.float32)
        out.append(row)
    return out


def softmax(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    e = np.exp(values - values.max())
    return np.asarray(e / e.sum())


def reference_top_p(row: Vector, p: float, scale: float, cap: int | None) -> set[int]:
    """llama.cpp's top-p on the sorted vocabulary (and a prefix cap of `cap` tokens)."""
    order = np.argsort(-row, kind="stable")
    cumulative = np.cumsum(softmax(row.astype(np.float64) * scale)[order])
    kept = int(np.searchsorted(cumulative, p)) + 1
    return {int(t) for t in order[: kept if cap is None else min(kept, cap)]}


def test_the_grid_takes_64_rows_or_a_divisor_of_an_odd_vocabulary() -> None:
    assert grid_rows(262_144) == 64 and grid_rows(49_152) == 64
    assert grid_rows(50_257) == 29  # 29 x 1733: narrower columns, the same cuts
    row = rows(64 * 50, count=1)[0]
    assert np.array_equal(Row(row).colmax, row.reshape(64, 50).max(axis=0))


@pytest.mark.parametrize("n_vocab", [64 * 512, 50_257])
def test_cuts_keep_what_sorting_the_whole_row_keeps(n_vocab: int) -> None:
    for row in rows(n_vocab, count=6):
        cut = Row(row.copy())
        top = float(row.max())
        assert cut.max == top
        assert cut.argmax() == int(np.argmax(row))
        for q in (0.5, 0.05, 0.01):
            kept = cut.at_least(top + math.log(q))
            assert set(kept.ids.tolist()) == set(np.flatnonzero(row >= top + math.log(q)).tolist())
            assert np.array_equal(kept.values, row[kept.ids])
        for k in (1, 40, 700):
            kept = cut.top_k(k)
            assert set(kept.ids.tolist()) == set(np.argsort(-row)[:k].tolist())


@pytest.mark.parametrize("n_vocab", [64 * 512, 50_257])
def test_tokens_at_least_are_at_leasts_through_columns_or_the_whole_row(n_vocab: int) -> None:
    for row in rows(n_vocab, count=4):
        row[: n_vocab // 3] = -np.inf  # a grammar's refusals: whole columns and parts of them
        cut = Row(row.copy())
        top = float(row.max())
        shares = []
        for q in (0.5, 1e-2, 1e-4, 1e-8):  # a few columns up to nearly all of them
            threshold = top + math.log(q)
            shares.append(np.count_nonzero(cut.colmax >= threshold) / cut.n_cols)
            ids, values = cut.tokens_at_least(threshold)
            assert np.array_equal(ids, np.flatnonzero(row >= threshold))  # ascending, as:
            assert np.array_equal(ids, cut.at_least(threshold).ids)
            assert np.array_equal(values, row[ids])
        whole_row = [share * cut_module.WHOLE_ROW_COLUMNS > 1 for share in shares]
        assert not whole_row[0] and whole_row[-1]  # both ways taken


def test_greedy_takes_the_lowest_id_of_equal_maxima() -> None:
    row = rows(count=1)[0]
    row[[900, 17, 30_000]] = row.max() + 1.0
    assert Row(row).argmax() == 17


def test_top_p_with_a_cap_always_decides_and_matches_a_sort() -> None:
    for row in rows(count=10, seed=3):
        cut = Row(row.copy())
        for p, q, scale in ((0.95, 0.01, 1.0), (0.5, 0.05, 1.0), (0.9, 0.001, 1 / 1.5)):
            cap = cut.at_least(cut.max + math.log(q) / scale)
            result = top_p(cut, p, scale, cap)
            assert result is not None
            ids, values = result
            assert set(ids.tolist()) == reference_top_p(row, p, scale, len(cap.ids))
            assert np.all(np.diff(values) <= 0)  # most likely first
        cap = cut.top_k(40)
        result = top_p(cut, 0.9, 1.0, cap)
        assert result is not None and set(result[0].tolist()) == reference_top_p(row, 0.9, 1.0, 40)


def test_top_p_on_a_sure_row_keeps_what_a_sort_keeps_however_it_is_decided() -> None:
    """A model repeating a text: one token far above the tail, top-p keeps it alone. The
    cap's columns, 32 more, or the whole normalizer decide it, by how heavy the tail is."""
    rng = np.random.default_rng(6)
    for gap, runners_up in ((6.0, 0), (9.0, 0), (12.0, 0), (16.0, 0), (12.0, 20), (16.0, 20)):
        row = (rng.standard_normal(64 * 512) * 2.0).astype(np.float32)
        row[123] = row.max() + gap
        row[rng.choice(64 * 512, runners_up, replace=False)] = row[123] - 7.0  # a few others
        cut = Row(row.copy())
        for p, q in ((0.95, 0.01), (0.9, 0.05), (0.99, 0.001)):
            cap = cut.at_least(cut.max + math.log(q))
            result = top_p(cut, p, 1.0, cap)
            assert result is not None
            assert set(result[0].tolist()) == reference_top_p(row, p, 1.0, len(cap.ids))


def test_top_p_reads_32_columns_more_only_where_they_can_decide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the cap's columns cannot decide: a sure row (a light tail) is decided by 32
    columns more; a row whose tail is heavy skips them for the whole normalizer."""
    summed: list[float] = []
    whole = Row.mass

    def mass(self: Row, top: float, scale: float) -> float:
        summed.append(whole(self, top, scale))
        return summed[-1]

    monkeypatch.setattr(Row, "mass", mass)
    sure = (np.random.default_rng(7).standard_normal(64 * 512) * 2.0).astype(np.float32)
    sure[123] = sure.max() + 10.0  # 0.997 of the mass
    heavy = rows(count=1, seed=8)[0]
    for row, p, reads_more in ((sure, 0.95, True), (heavy, 0.7, False)):
        cut = Row(row.copy())
        cap = cut.at_least(cut.max + math.log(0.001))
        peaks = cut.peaks(cut.max, 1.0)
        ordered = cut_module.most_likely_first(cap.ids, cap.values)[1]
        cumulative = cut_module._cumulative(ordered, cut.max, 1.0)
        bounds = cut.mass_bounds(cap.cols, cap.read, cut.max, 1.0, peaks)
        assert cut_module._kept(cumulative, p, *bounds, capped=True) is None
        assert (cut_module._beside(cut, cap, p, peaks) is not None) is reads_more
        summed.clear()
        result = top_p(cut, p, 1.0, cap)
        assert result is not None and bool(summed) is not reads_more
        assert set(result[0].tolist()) == reference_top_p(row, p, 1.0, len(cap.ids))


def test_top_p_alone_is_exact_when_it_decides() -> None:
    decided = 0
    for row in rows(count=10, seed=4):
        for p in (0.3, 0.8, 0.95):
            result = top_p(Row(row.copy()), p)
            if result is not None:
                decided += 1
                assert set(result[0].tolist()) == reference_top_p(row, p, 1.0, None)
    assert decided  # the undecided rest goes to llama.cpp's own top-p


@pytest.mark.parametrize(
    ("alpha", "p", "decided"), [(1.0, 0.5, True), (1.2, 0.8, True), (1.0, 0.95, False)]
)
def test_top_p_alone_reads_its_head_once_the_normalizer_is_summed(
    alpha: float, p: float, decided: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Zipf-like row (probability ~ rank^-alpha) whose top-p head runs past the 32
    columns read: with the normalizer summed, every token above the column maximum at
    which the maxima reach p is read (they hold 57% of the mass at alpha 1.0), or above
    the least maximum when they hold less (80% at alpha 1.2); when even those tokens
    hold less than p, llama.cpp's top-p decides."""
    rng = np.random.default_rng(3)
    n_vocab = 64 * 512
    ranks = np.arange(1, n_vocab + 1)[rng.permutation(n_vocab)]
    row = (-alpha * np.log(ranks)).astype(np.float32)
    heads = []
    head = cut_module._head

    def spy(*args: Any) -> Any:
        heads.append(head(*args))
        return heads[-1]

    monkeypatch.setattr(cut_module, "_head", spy)
    result = top_p(Row(row.copy()), p)
    assert len(heads) == 1  # the 32 columns could not decide it
    if decided:
        assert result is not None and set(result[0].tolist()) == reference_top_p(row, p, 1, None)
    else:
        assert result is None
    # a grammar's refusals (-inf) in half the columns: the least maximum is a finite one
    row.reshape(64, -1)[:, ::2] = -np.inf
    result = top_p(Row(row.copy()), p)
    assert (result is not None) is decided
    if result is not None:
        assert set(result[0].tolist()) == reference_top_p(row, p, 1, None)


@pytest.mark.parametrize("scale", [1.0, 1 / 0.7, 4.0])
@pytest.mark.parametrize("offset", [0.0, 60.0, -60.0])
def test_the_normalizer_is_exact_to_float32_at_every_scale_and_level(
    scale: float, offset: float
) -> None:
    """Logits far from zero (offset) take the shifted exp(); others skip the shift."""
    for row in rows(count=3, seed=6):
        row = (row + np.float32(offset)).astype(np.float32)
        cut = Row(row.copy())
        exact = float(np.exp((row.astype(np.float64) - cut.max) * scale).sum())
        assert cut.mass(cut.max, scale) == pytest.approx(exact, rel=5e-6)


@pytest.mark.parametrize("n", [10, cut_module.KEYED_SORT, 5000])
def test_most_likely_first_sorts_equals_in_the_order_given_at_every_size(n: int) -> None:
    """Below KEYED_SORT numpy's stable sort, from it one sort of (value bits, position)."""
    rng = np.random.default_rng(9)
    values = rng.standard_normal(n).astype(np.float32)
    values[: n // 3] = values[n // 3 : 2 * (n // 3)]  # ties
    values[[1, 2, 3]] = [-np.inf, -0.0, 0.0]  # -0.0 equals 0.0: the order given
    ids = rng.permutation(n).astype(np.int64)
    order = np.argsort(-values, kind="stable")
    got_ids, got_values = cut_module.most_likely_first(ids, values)
    assert np.array_equal(got_ids, ids[order]) and np.array_equal(got_values, values[order])


def test_the_mass_bounds_bracket_the_normalizer() -> None:
    for row in rows(count=5, seed=5):
        cut = Row(row.copy())
        exact = float(np.exp(row.astype(np.float64) - cut.max).sum())
        assert cut.mass(cut.max, 1.0) == pytest.approx(exact, rel=1e-5)
        for m in (0, 5, 100):
            cols = cut.top_columns(m)
            peaks = cut.peaks(cut.max, 1.0)
            low, high = cut.mass_bounds(cols, cut.columns(cols), cut.max, 1.0, peaks)
            assert low <= exact * (1 + 1e-9) and exact <= high * (1 + 1e-9)


@pytest.mark.parametrize("read_first", [True, False])
def test_a_patch_changes_the_row_and_its_maxima_until_restored(read_first: bool) -> None:
    """Whether the maxima were read before the patch (then patched with it) or not (then
    read from the patched row, and dropped with the patch)."""
    row = rows(count=1)[0]
    original = row.copy()
    own = original.reshape(64, -1).max(axis=0)
    cut = Row(row)
    maxima = cut.colmax if read_first else None
    top = int(np.argmax(original))
    ids = np.array(sorted({top, 5, 9_000}), np.int64)
    cut.patch(ids, np.array([50.0 if i == 5 else -np.inf for i in ids], np.float32))
    assert cut.argmax() == 5
    assert cut.max == max(50.0, float(np.delete(original, ids).max()))
    assert np.array_equal(cut.colmax, row.reshape(64, -1).max(axis=0))
    cut.restore()
    assert (cut._colmax is None) is (maxima is None)  # those read under the patch went
    assert np.array_equal(row, original) and np.array_equal(cut.colmax, own)
    assert cut.max == original.max() and (maxima is None or cut.colmax is maxima)


@pytest.mark.parametrize("spread", [1.0, 2.5])
def test_a_draw_over_many_columns_follows_the_softmax(spread: float) -> None:
    """On 512 columns of 64 tokens, each proposed from its column's maximum and kept by
    its weight over it: the draws match the softmax by rank bands, deep tail included."""
    rng = np.random.default_rng(8)
    row = (rng.standard_normal(64 * 512) * spread).astype(np.float32)
    row[rng.choice(len(row), 5, replace=False)] += np.float32(6)
    cut = Row(row)
    scale = 1 / 0.8
    want = softmax(row.astype(np.float64) * scale)
    rank = np.empty(len(row), np.int64)
    rank[np.argsort(-want)] = np.arange(len(row))
    bands = np.searchsorted([1, 5, 20, 100, 1000, 5000], rank, side="right")
    assert np.bincount(bands, weights=want)[-2:].sum() > 0.1  # the tail has its share
    draws = np.array([cut.draw(scale, rng) for _ in range(12_000)])
    got = np.bincount(bands[draws], minlength=7) / len(draws)
    expected = np.bincount(bands, weights=want, minlength=7)
    assert 0.5 * np.abs(got - expected).sum() < 0.03  # total variation over the bands


def test_a_draw_follows_the_softmax_and_never_a_masked_token() -> None:
    rng = np.random.default_rng(7)
    row = (rng.standard_normal(64 * 4) * 1.5).astype(np.float32)
    row[[3, 100]] = -np.inf
    cut = Row(row)
    scale = 1 / 0.7
    draws = np.bincount([cut.draw(scale, rng) for _ in range(30_000)], minlength=len(row))
    want = softmax(row.astype(np.float64) * scale)
    assert draws[3] == draws[100] == 0
    assert 0.5 * np.abs(draws / draws.sum() - want).sum() < 0.03  # total variation


def test_a_draw_from_a_row_without_finite_weights_says_so_and_ends() -> None:
    rng = np.random.default_rng(7)
    logits = rng.standard_normal(64 * 4).astype(np.float32)
    # a repeat penalty of 0 on every token: the positive ones / 0, the others * 0
    penalized = np.where(logits > 0, np.inf, 0.0).astype(np.float32)
    for row in (penalized, np.full(64 * 4, np.nan, np.float32)):
        with np.errstate(invalid="ignore"), pytest.raises(ValueError, match="no token to draw"):
            Row(row).draw(1.0, rng)

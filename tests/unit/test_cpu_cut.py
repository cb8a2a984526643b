"""llama_srb/_cpu_cut.c's op, the device's cut where the output rows are on the CPU: the k
most likely positions of a row, in the host path's order (most likely first, lower
positions first among equals), against numpy's stable sort, over rows that cross its
64-logit blocks, hold runs of equals and -inf, and are worst-case ordered."""

from __future__ import annotations

import numpy as np
import pytest

from llama_srb import _cpu_cut


def ranked(values: np.ndarray, k: int) -> list[int]:
    return np.argsort(-values, kind="stable")[:k].tolist()


def cut(values: np.ndarray, k: int) -> list[int]:
    out = np.empty(k, np.int32)
    _cpu_cut.top_k(values, out)
    return out.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_k_most_likely_in_the_host_path_s_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (1, 63, 64, 65, 127, 128, 129, 4096, 4097):
        for k in sorted({1, min(n, 2), min(n, 40), min(n, 64), n}):
            normal = rng.standard_normal(n).astype(np.float32)
            assert cut(normal, k) == ranked(normal, k), (n, k)
            ties = rng.integers(-3, 3, n).astype(np.float32)  # runs of equals at the cut
            ties[rng.random(n) < 0.2] = -np.inf
            assert cut(ties, k) == ranked(ties, k), (n, k)


def test_rows_in_the_worst_order_and_all_equal() -> None:
    rising = np.arange(5000, dtype=np.float32)  # every logit enters the heap
    assert cut(rising, 64) == ranked(rising, 64)
    flat = np.zeros(5000, np.float32)
    assert cut(flat, 64) == list(range(64))
    masked = np.full(300, -np.inf, np.float32)
    masked[[7, 250]] = 1.0
    assert cut(masked, 3) == [7, 250, 0]


def test_it_refuses_what_it_cannot_read() -> None:
    row = np.zeros(10, np.float32)
    with pytest.raises(ValueError):
        _cpu_cut.top_k(row, np.empty(11, np.int32))  # more than the row holds
    with pytest.raises(ValueError):
        _cpu_cut.top_k(row, np.empty(0, np.int32))
    with pytest.raises(TypeError):
        _cpu_cut.top_k(row.astype(np.float64), np.empty(3, np.int32))
    with pytest.raises(TypeError):
        _cpu_cut.top_k(row, np.empty(3, np.int64))

"""Row.mask against the bit-by-bit rule and numpy's column maxima, for masks of every shape
a grammar makes: on a vocabulary of whole mask words (grid columns of whole words), on one
whose last word is only partly vocabulary, and on one whose words cross the grid's rows."""

from __future__ import annotations

import numpy as np
import pytest

from llama_srb.sampling.cut import Row
from llama_srb.sampling.masks import allowed

VOCABULARIES = (32 * 4096, 32 * 4096 + 17, 1000)  # 1000: a grid of 50 rows by 20 columns


def masks(n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    words = (n_vocab + 31) // 32

    def scattered(p: float) -> np.ndarray:
        bits = rng.random(words * 32) < p
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    few = np.zeros(words, np.int32)
    few[[3, words // 2]] = [0b1011, -1]  # a handful of tokens: a JSON structure character
    most = np.full(words, -1, np.int32)
    most[[0, 7, words - 1]] = [0, 0x7FFF_FFFF, 5]  # all but a few: inside a string
    return {
        "scattered": scattered(0.5),
        "sparse scattered": scattered(0.01),
        "few allowed": few,
        "most allowed": most,
        "nothing": np.zeros(words, np.int32),
        "everything": np.full(words, -1, np.int32),
    }


@pytest.mark.parametrize("n_vocab", VOCABULARIES)
@pytest.mark.parametrize("name", list(masks(VOCABULARIES[0])))
def test_a_mask_refuses_exactly_the_tokens_its_bits_refuse(name: str, n_vocab: int) -> None:
    mask = masks(n_vocab)[name]
    logits = np.random.default_rng(1).standard_normal(n_vocab).astype(np.float32)
    expected = np.where(allowed(mask, n_vocab), logits, -np.inf).astype(np.float32)
    row = Row(logits)
    row.mask(mask)
    assert np.array_equal(logits, expected)
    assert np.array_equal(row.colmax, expected.reshape(row.grid.shape).max(axis=0))
    assert row.max == expected.max()


def test_a_mask_that_does_not_fit_the_row_is_refused_before_it_is_read() -> None:
    row = Row(np.zeros(1000, np.float32))
    with pytest.raises(ValueError, match="shorter than the row"):
        row.mask(np.full(31, -1, np.int32))  # 1000 tokens need 32 words
    with pytest.raises(ValueError, match="float32"):
        Row(np.zeros(1000, np.float64)).mask(np.full(32, -1, np.int32))

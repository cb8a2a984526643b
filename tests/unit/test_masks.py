"""apply_mask against the bit-by-bit rule, for masks of every shape a grammar makes, on a
vocabulary of whole mask words and on one whose last word is only partly vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from llama_srb.sampling.masks import allowed, apply_mask

VOCABULARIES = (32 * 4096, 32 * 4096 + 17)


def masks(n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    words = (n_vocab + 31) // 32

    def scattered(p: float) -> np.ndarray:
        bits = rng.random(words * 32) < p
        return np.packbits(bits, bitorder="little").view(np.int32).copy()

    few = np.zeros(words, np.int32)
    few[[3, 900]] = [0b1011, -1]  # a handful of tokens: a JSON structure character
    most = np.full(words, -1, np.int32)
    most[[0, 77, words - 1]] = [0, 0x7FFF_FFFF, 5]  # all but a few: inside a string
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
    apply_mask(logits, mask)
    assert np.array_equal(logits, expected)

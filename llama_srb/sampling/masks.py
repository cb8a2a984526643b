"""Token masks for the constrained rows of a step: every matcher's mask computed in one
call (llguidance's pool, outside the GIL) into one bitmask (a row applies one to itself:
sampling/cut.py's `Row.mask`).

A mask row is ceil(n_vocab / 32) int32 words, bit t of the row allowing token t.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.numpy
import numpy as np
import numpy.typing as npt

from llama_srb.sampling.constraint import Matcher

Bitmask = npt.NDArray[np.int32]


class MaskBatch:
    """Fills the masks of many matchers at once; owns its buffers and thread pool (one
    per engine, used from one thread)."""

    def __init__(self, n_vocab: int, threads: int | None = None) -> None:
        self.n_vocab = n_vocab
        self._executor = llguidance.LLExecutor(threads)  # None: llguidance's default count
        self._masks: Bitmask = llguidance.numpy.allocate_token_bitmask(0, n_vocab)

    def fill(self, matchers: Sequence[Matcher]) -> Bitmask:
        """Row i: the tokens `matchers[i]` allows next (only the end-of-generation tokens
        once it is stopped). A matcher that meets a limit here goes into its error
        state (`Matcher.error`) and its row allows nothing. The rows are this batch's
        buffer, valid until the next call."""
        if len(matchers) > len(self._masks):
            self._masks = llguidance.numpy.allocate_token_bitmask(len(matchers), self.n_vocab)
        masks = self._masks[: len(matchers)]
        if matchers:
            pairs = [(m.inner, i) for i, m in enumerate(matchers)]
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, masks)
        return masks


def allowed(mask: Bitmask, n_vocab: int) -> npt.NDArray[np.bool_]:
    """One mask row as one bool per token."""
    bits = np.unpackbits(mask.view(np.uint8), count=n_vocab, bitorder="little")
    return bits.view(np.bool_)


def allowed_tokens(mask: Bitmask, n_vocab: int) -> npt.NDArray[np.intp]:
    """The ids `mask` allows, ascending: the candidates of a row whose mask is sparse."""
    return np.flatnonzero(allowed(mask, n_vocab))

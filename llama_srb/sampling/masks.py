"""Token masks for the constrained rows of a step: every matcher's mask computed in one
call (llguidance's pool, outside the GIL) into one bitmask, and applied to logits rows.

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
_NEG_INF = np.float32(-np.inf)


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


def apply_mask(logits: npt.NDArray[np.float32], mask: Bitmask) -> None:
    """Set the logits of the tokens `mask` forbids to -inf, in place. A JSON or grammar
    mask is mostly whole words (32 tokens all allowed or all refused): when it is, the
    row is handled 32 tokens at a time, only its mixed words bit by bit, and only the
    fewer side is written (the refused words, or the allowed ones after one fill)."""
    n_vocab = len(logits)
    allow_all, refuse_all = mask == -1, mask == 0
    mixed = np.flatnonzero(~(allow_all | refuse_all))
    if n_vocab % 32 or len(mixed) * 8 > len(mask):  # scattered: bit by bit, the whole row
        np.copyto(logits, _NEG_INF, where=~allowed(mask, n_vocab))
        return
    words = logits.reshape(-1, 32)
    kept, refused = np.flatnonzero(allow_all), np.flatnonzero(refuse_all)
    if len(kept) < len(refused):  # few allowed: the whole row refused, then theirs put back
        block = words[mixed]
        block[~allowed(mask[mixed], 32 * len(mixed)).reshape(-1, 32)] = _NEG_INF
        saved = words[kept]
        logits.fill(_NEG_INF)
        words[kept] = saved
        words[mixed] = block
    else:  # (by index: a boolean index of the words is several times slower)
        words[refused] = _NEG_INF
        bits = np.flatnonzero(~allowed(mask[mixed], 32 * len(mixed)))  # in the mixed words
        logits[mixed[bits >> 5] * 32 + (bits & 31)] = _NEG_INF


def allowed_tokens(mask: Bitmask, n_vocab: int) -> npt.NDArray[np.intp]:
    """The ids `mask` allows, ascending: the candidates of a row whose mask is sparse."""
    return np.flatnonzero(allowed(mask, n_vocab))

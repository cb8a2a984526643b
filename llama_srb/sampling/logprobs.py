"""Log-probabilities of tokens under the model's raw distribution (before any sampler).

Only requests that ask for logprobs (or rank their branches: best_of) reach this module:
the engine skips it otherwise, so a plain request never sums its row's exponentials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llama_srb.sampling import cut


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the k most likely tokens, most likely first


class RowScores:
    """The normalizer and top k of one logits row: the model's own distribution, read
    through the row's column maxima (sampling/cut.py). A sampler's changes to the row
    (bias, penalties, masks) are undone before `entry` reads the sampled token's logit."""

    def __init__(self, row: cut.Row, k: int) -> None:
        self._row = row
        top = row.max
        self.lse = top + math.log(row.mass(top, 1.0))
        self.top: tuple[tuple[int, float], ...] = ()
        if k > 0:
            ids, values, *_ = row.top_k(k)
            order = np.lexsort((ids, -values))  # most likely first, lower ids first on ties
            self.top = tuple((int(ids[i]), float(values[i]) - self.lse) for i in order)

    def entry(self, token: int) -> TokenLogprob:
        return TokenLogprob(token, float(self._row.logits[token]) - self.lse, self.top)

"""Log-probabilities of tokens under the model's raw distribution (before any sampler).

Only requests that ask for logprobs reach this module: the engine skips it otherwise, so
a plain request never runs numpy over its logits row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Row = npt.NDArray[np.float32]


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the k most likely tokens, most likely first


def logsumexp(row: Row) -> float:
    """log(sum(exp(row))), shifted by the maximum so that exp cannot overflow."""
    peak = float(row.max())
    return peak + float(np.log(np.exp(row - peak, dtype=np.float64).sum()))


def top_k(row: Row, k: int, lse: float) -> tuple[tuple[int, float], ...]:
    """The k most likely tokens and their log-probabilities, most likely first."""
    if k <= 0:
        return ()
    k = min(k, row.shape[0])
    # argpartition is O(n): only the k winners get sorted.
    ids = np.argpartition(row, -k)[-k:]
    ids = ids[np.argsort(-row[ids], kind="stable")]
    return tuple((int(t), float(row[t]) - lse) for t in ids)


class RowScores:
    """The normalizer and top k of one logits row, taken before the row is changed.

    The engine masks end-of-generation tokens in place before sampling; what is read here
    first is the model's own distribution. `entry` reads the sampled token's logit later,
    which the mask cannot have touched (a masked token is never sampled).
    """

    def __init__(self, row: Row, k: int) -> None:
        self._row = row
        self.lse = logsumexp(row)
        self.top = top_k(row, k, self.lse)

    def entry(self, token: int) -> TokenLogprob:
        return TokenLogprob(token, float(self._row[token]) - self.lse, self.top)


def score_token(row: Row, token: int, k: int) -> TokenLogprob:
    """The log-probability of `token` under `row`, with the k most likely alternatives."""
    return RowScores(row, k).entry(token)

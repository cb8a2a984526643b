"""The first cut of a sampler chain, found over the whole logits row without sorting it.

A chain's first filter (top-k, min-p, top-p) reads the whole vocabulary; everything after
it reads only its survivors, tens to thousands of tokens. llama.cpp builds a candidate
array of every token (262,144 for Gemma 3) and sorts it, for every branch and token: most of
the host time of a step. Here the row is read once, as a grid of 64 rows by n_vocab/64
columns (token r * n_cols + c at [r, c]), into the maximum of each column: one pass the
CPU's vector units make at memory speed, which leaves the row in the core's cache for the
columns the cut reads next (each branch's row is read just before it samples). Every cut is
then decided from those maxima and the few columns they point to, exactly: a column whose
maximum is below a threshold holds no token above it. The survivors go on to the rest of
the chain in llama.cpp (sampling/branch.py), so every later sampler is llama.cpp's own.

A top-p with a min-p or top-k right after it (its cap) needs the distribution's normalizer
only roughly: it brackets it between a lower bound (the columns read exactly, one token
for each other column) and an upper bound (each other column as 64 copies of its maximum),
from the cap's columns first (most often its tokens hold less than p of even the lower
bound; when the model is sure of its next token, the upper bound keeps only it), then with
32 columns more when the other columns are light enough for those to decide it; only then
is every token's exp() summed. A top-p alone sums it at once (its head runs hundreds of
tokens deep, past what a few columns bracket), then reads every token above the column
maximum at which the maxima add up to p: they are tokens themselves. A draw from every
token needs no normalizer: it is a rejection over the columns.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from llama_srb.sampling import _rows

Vector = npt.NDArray[np.float32]
Ids = npt.NDArray[np.int64]

MAX_GRID_ROWS = 64  # tokens per column: the column maxima are a 64th of the row
# Columns read beside a capped top-p's own when those cannot bracket its normalizer: they
# decide a row the model is sure of, whose other columns are light; a heavy tail would need
# 2,048-4,096 (summing every token's exp() costs about ten reads of 32 columns). Without a
# cap they decided 0-4 of 248 rows of Gemma 3 at p = 0.8-0.95: a top-p alone sums at once.
NORMALIZER_COLUMNS = 32
# Gathering the columns a threshold keeps costs more than one pass over the whole row once
# more than a 16th of them are kept (measured on Gemma 3's rows: equal at 7%, 3.5x at 63%).
WHOLE_ROW_COLUMNS = 16
# From this many tokens up, sorting them by one key per token (value bits, position) is
# faster than numpy's stable sort (a merge sort): 2,000 tokens 121 -> 46 µs, 8,000 732 -> 146.
KEYED_SORT = 1024
# The relative rounding of exp_sum over a row (a 2e-7 exp(), float32 sums of 64) and of
# the peaks' pairwise sum is below 1e-6: the normalizer's bounds are widened by ten times
# that, so they stay bounds.
MASS_ROUNDING = 1e-5
# Rounds of 256 tries for a draw: a finite row's fail all with probability (63/64)**2048.
DRAW_ROUNDS = 8


@functools.lru_cache(maxsize=8)
def grid_rows(n_vocab: int) -> int:
    """Rows of the grid: 64, or the largest divisor of n_vocab below it (a vocabulary of
    an odd size gets narrower columns: the same cuts, read less cheaply)."""
    return next(r for r in range(MAX_GRID_ROWS, 0, -1) if n_vocab % r == 0)


class Cut(NamedTuple):
    """A cut's survivors, and what it read to find them: the columns and every logit in
    them (the normalizer of a top-p before it needs them)."""

    ids: Ids
    values: Vector
    cols: Ids
    read: npt.NDArray[np.float32]  # (grid rows, len(cols))


class Row:
    """One logits row as the cuts read it. `mask` refuses a grammar's tokens for good;
    `patch` changes a few tokens in place (and the maxima of their columns) until
    `restore`: the chain's bias, penalties and masked tokens."""

    __slots__ = ("_colmax", "_max", "_saved", "grid", "logits", "n_cols")
    eog = True  # it holds every token, end of generation's among them (DeviceRow: maybe)

    def __init__(self, logits: Vector, colmax: Vector | None = None) -> None:
        self.logits = logits
        rows = grid_rows(len(logits))
        self.n_cols = len(logits) // rows
        self.grid = logits.reshape(rows, self.n_cols)
        self._colmax = colmax
        self._saved: tuple[Ids, Vector, Vector | None, float | None] | None = None
        self._max: float | None = None

    @property
    def colmax(self) -> Vector:
        """Each column's maximum (as patched): read on first use, after any mask."""
        if self._colmax is None:
            self._colmax = self.grid.max(axis=0)
        return self._colmax

    def read_maxima(self) -> None:
        """Read the column maxima now: maxima first read under a patch go with it, so a
        row that several branches patch is read before."""
        self._colmax = self.colmax

    def mask(self, mask: npt.NDArray[np.int32]) -> None:
        """Set the logits of the tokens a grammar's `mask` refuses (int32 words, bit t
        allowing token t) to -inf in place, reading the column maxima in the same pass."""
        assert self._saved is None, "not while patched"
        self._colmax, self._max = np.empty(self.n_cols, np.float32), None
        _rows.mask_row(self.logits, mask, self._colmax)

    @property
    def max(self) -> float:
        """The largest logit (as patched)."""
        if self._max is None:
            self._max = float(self.colmax.max())
        return self._max

    def patch(self, ids: Ids, values: Vector) -> None:
        """Give tokens `ids` (distinct) the logits `values` until `restore`."""
        assert self._saved is None, "one patch at a time"
        old = self.logits[ids]
        self._saved = (ids, old, self._colmax, self._max)
        self.logits[ids] = values
        if self._colmax is None:
            return  # the maxima are read from the patched row, if they are needed at all
        cols = ids % self.n_cols
        # A column's maximum moves only where a token rose above it or was it: usually
        # none (end-of-generation masked, a penalized word that was not its column's top).
        peaks = self.colmax[cols]
        moved = cols[(values > peaks) | (old >= peaks)]
        if len(moved):
            self._max = None
            self._colmax = self.colmax.copy()  # the maxima may be shared with other branches
            self._colmax[moved] = self.columns(moved).max(axis=0)

    def restore(self) -> None:
        if self._saved is not None:
            ids, values, self._colmax, self._max = self._saved
            self.logits[ids] = values
            self._saved = None

    # -- reading the row through its columns ------------------------------------------

    def columns(self, cols: Ids) -> npt.NDArray[np.float32]:
        """grid[:, cols], in C order: numpy's own index of the columns is in Fortran
        order, which each ravel copies (3-5x slower, with it, at 40-1,000 columns)."""
        return np.take(self.grid, cols, axis=1)

    def ids(self, cols: Ids, flat: npt.NDArray[np.intp]) -> Ids:
        """The token ids of positions `flat` in the raveled columns(cols)."""
        rows, at = np.divmod(flat, len(cols))
        return rows * self.n_cols + cols[at]

    def top_columns(self, m: int) -> Ids:
        """The m columns with the largest maxima."""
        return largest(self.colmax, m)

    def argmax(self) -> int:
        """The most likely token, the lowest id of equals (llama.cpp's greedy pick)."""
        if self._colmax is None:  # one pass over the row, which a greedy pick reads alone
            return int(np.argmax(self.logits))
        cols = np.flatnonzero(self.colmax == self.max)
        return int(self.ids(cols, np.flatnonzero(self.columns(cols) == self.max)).min())

    def at_least(self, threshold: float) -> Cut:
        """Every token whose logit is at least `threshold`, with the columns read for it (a
        min-p cap: they bracket the normalizer of the top-p before it)."""
        return self._read_at_least(np.flatnonzero(self.colmax >= threshold), threshold)

    def tokens_at_least(self, threshold: float) -> tuple[Ids, Vector]:
        """at_least's tokens and logits alone (ids ascending, as there): from one pass over
        the row when more than 1/WHOLE_ROW_COLUMNS of the columns hold one."""
        cols = np.flatnonzero(self.colmax >= threshold)
        if len(cols) * WHOLE_ROW_COLUMNS <= self.n_cols:
            cut = self._read_at_least(cols, threshold)
            return cut.ids, cut.values
        ids = np.flatnonzero(self.logits >= threshold)
        return ids, self.logits[ids]

    def _read_at_least(self, cols: Ids, threshold: float) -> Cut:
        read = self.columns(cols)
        flat = np.flatnonzero(read >= threshold)
        return Cut(self.ids(cols, flat), read.ravel()[flat], cols, read)

    def top_k(self, k: int) -> Cut:
        """The k most likely tokens. The k columns with the largest maxima hold them:
        their k maxima are k tokens at least as likely as any token of another column."""
        cols = self.top_columns(k)
        read = self.columns(cols)
        values = read.ravel()
        return Cut(self.ids(cols, flat := largest(values, k)), values[flat], cols, read)

    def peaks(self, top: float, scale: float) -> Vector:
        """Each column maximum's weight, exp(scale * (maximum - top))."""
        return np.exp((self.colmax - np.float32(top)) * np.float32(scale))

    def mass_bounds(
        self, cols: Ids, read: npt.NDArray[np.float32], top: float, scale: float, peaks: Vector
    ) -> tuple[float, float]:
        """Bounds on sum(exp(scale * (logit - top))) over the row, from every logit `read`
        of columns `cols` and each other column's maximum (`peaks`: their weights): a
        token of the column at the least, all of them at the most. Summed in float32, so
        each bound is widened by far more than its rounding (MASS_ROUNDING)."""
        exact = _rows.exp_sum(read, top, scale)
        others = max(float(peaks.sum()) - float(peaks[cols].sum()), 0.0)
        low, high = exact + others, exact + len(self.grid) * others
        return low * (1 - MASS_ROUNDING), high * (1 + MASS_ROUNDING)

    def mass(self, top: float, scale: float) -> float:
        """sum(exp(scale * (logit - top))) over every token, `top` the row's maximum: one
        pass in C (sampling/_rows.c), as float32 sums of 64 added up in double (under 1e-6
        relative, finer than llama.cpp's own running sum)."""
        return _rows.exp_sum(self.logits, top, scale)

    def draw(self, scale: float, rng: np.random.Generator) -> int:
        """A token drawn from softmax(scale * logits) over the whole vocabulary, exactly:
        rejection sampling, each column's maximum its envelope. Each try accepts with
        probability 1/64 at the least, so a row none of whose tries is accepted has no
        weights to draw from (inf or NaN logits): ValueError."""
        weights = np.cumsum(np.exp((self.colmax.astype(np.float64) - self.max) * scale))
        for _ in range(DRAW_ROUNDS):
            cols = np.searchsorted(weights, rng.random(256) * weights[-1], side="right")
            cols = np.minimum(cols, self.n_cols - 1)
            rows = rng.integers(0, len(self.grid), len(cols))
            accept = np.exp((self.grid[rows, cols] - self.colmax[cols]).astype(np.float64) * scale)
            accepted = np.flatnonzero(rng.random(len(cols)) < accept)
            if len(accepted):
                first = accepted[0]
                return int(rows[first]) * self.n_cols + int(cols[first])
        raise ValueError(f"no token to draw: the row's weights are not finite (max {self.max})")


def top_p(
    row: Row, p: float, scale: float = 1.0, cap: Cut | None = None
) -> tuple[Ids, Vector] | None:
    """llama.cpp's top-p over the whole row: the most likely tokens, most likely first,
    until their probability under softmax(scale * logits) adds up to p. With `cap`, the
    survivors of the prefix cut that follows it (min-p or top-k: a top of the same
    order), both at once: the shorter of the two. None when what it reads cannot decide
    it (alone: the tokens above the least column maximum hold less than p) or its cut
    splits equal logits: llama.cpp's own top-p then runs."""
    top = row.max
    if cap is None:
        return _head(row, p, scale, row.mass(top, scale))
    peaks = row.peaks(top, scale)
    ids, values = most_likely_first(cap.ids, cap.values)
    cumulative = _cumulative(values, top, scale)
    kept = _kept(cumulative, p, *row.mass_bounds(cap.cols, cap.read, top, scale, peaks), True)
    if kept is None:  # the cap's columns could not decide: more beside
        wider = _beside(row, cap, p, peaks)
        if wider is not None:
            kept = _kept(cumulative, p, *row.mass_bounds(*wider, top, scale, peaks), True)
    if kept is None:
        mass = row.mass(top, scale)
        kept = _kept(cumulative, p, mass, mass, True)
    return _first(ids, values, kept)


def _head(row: Row, p: float, scale: float, mass: float) -> tuple[Ids, Vector] | None:
    """Top-p's head once the normalizer is known: every token at least as likely as the
    column maximum at which the maxima, largest first, add up to p. They are tokens, so
    the tokens above it hold p at least. None when even the tokens above the least
    maximum hold less than p."""
    # maxima that hold less than p: every token above the least of them, if those do
    threshold = _rows.head(row.colmax, row.max, scale, p * mass)
    ids, values = most_likely_first(*row.tokens_at_least(threshold))
    return _first(ids, values, _kept(_cumulative(values, row.max, scale), p, mass, mass, False))


def _first(ids: Ids, values: Vector, kept: int | None) -> tuple[Ids, Vector] | None:
    """The first `kept` tokens; None (llama.cpp's top-p decides) when that splits equals:
    which of them it keeps is its sort's."""
    if kept is None or (kept < len(values) and values[kept] == values[kept - 1]):
        return None
    return ids[:kept], values[:kept]


def _beside(
    row: Row, cap: Cut, p: float, peaks: Vector
) -> tuple[Ids, npt.NDArray[np.float32]] | None:
    """The cap's columns and, read beside them, the NORMALIZER_COLUMNS of largest maxima:
    for a row the model is sure of, whose other columns are light. None when the columns
    left unread are too heavy for those to decide: they keep the bounds (grid rows - 1)
    times their peaks apart, and when that times p is more than the top token's weight
    (the most any token has), no token can end its mass >= p under both. (They could
    still find the cap the shorter; on the default model's rows 32 columns never did.)"""
    extra = row.top_columns(NORMALIZER_COLUMNS)
    known = np.zeros(row.n_cols, bool)
    known[cap.cols] = True
    new = extra[~known[extra]]
    known[new] = True
    unread = float(peaks.sum()) - float(peaks[known].sum())
    if p * (len(row.grid) - 1) * unread > 1.0:
        return None
    return np.concatenate([cap.cols, new]), np.concatenate([cap.read, row.columns(new)], axis=1)


def _kept(
    cumulative: npt.NDArray[np.float64], p: float, low: float, high: float, capped: bool
) -> int | None:
    """How many tokens top-p keeps when the normalizer's bounds [low, high] decide it: the
    same token ends its mass >= p under both, or (`capped`) the cap holds less than p
    under the lower one, so the cap is shorter."""
    first, last = np.searchsorted(cumulative, [p * low, p * high])
    if first == last < len(cumulative):
        return int(first) + 1
    if capped and first == len(cumulative):
        return int(first)
    return None


def largest(values: Vector, k: int) -> npt.NDArray[np.intp]:
    """The positions of the k largest `values` (C-contiguous float32), in no order; -inf
    ones (a grammar's refusals) fill it when fewer are finite."""
    if k >= len(values):
        return np.arange(len(values))
    positions = np.empty(k, np.intp)
    _rows.top_k(values, positions)
    return positions


def most_likely_first(ids: Ids, values: Vector) -> tuple[Ids, Vector]:
    """The tokens (ids, values) by descending value, equals in the order given."""
    order = np.argsort(-values, kind="stable") if len(values) < KEYED_SORT else _by_key(values)
    return ids[order], values[order]


def _by_key(values: Vector) -> npt.NDArray[np.intp]:
    """The stable descending order of `values` from one vectorized sort of distinct keys:
    each float's bits made to sort as its value (negatives flipped whole, positives by
    their sign bit), inverted for descending, above its position."""
    bits = (values + np.float32(0)).view(np.uint32)  # -0.0 as 0.0: they are equal
    ascending = np.where(bits >> 31, ~bits, bits | np.uint32(1 << 31))
    keys = (~ascending).astype(np.uint64) << np.uint64(32) | np.arange(len(values), dtype=np.uint64)
    return (np.sort(keys) & np.uint64(0xFFFFFFFF)).astype(np.intp)


def _cumulative(values: Vector, top: float, scale: float) -> npt.NDArray[np.float64]:
    """The running sum of exp(scale * (logit - top)) of `values`, in order."""
    return np.cumsum(np.exp((values.astype(np.float64) - top) * scale))

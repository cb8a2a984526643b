"""A logits row as llama.cpp's backend sampling leaves it: its K most likely tokens, cut
inside llama_decode by a top_k(K) chain on the branch's sequence (engine/device_cut.py),
and what they prove of every other token: none is above the K-th (`floor`).

A chain whose first cut is a top-k of k < K, the greedy pick or a min-p picks from these
exactly what it picks from the whole row, when they prove it: after the branch's masks
(end of generation, banned tokens) a top-k's k-th survivor is above the floor and not equal
to the next (which of equal tokens at its edge the host path keeps is its own sort's; equal
tokens inside it go lowest id first on both paths), and a min-p's threshold is above the
floor. Otherwise `Undecided`, raised before the chain changes any state: the branch reads
the whole row for this step. The chains it serves raise no token (no bias, penalties,
DRY or grammar), so a patch only lowers tokens, and a lowered token off the list changes
nothing it decides.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llama_srb.sampling import _rows
from llama_srb.sampling.cut import Cut, Ids, Vector

NO_COLUMNS = np.empty(0, np.int64)
NO_READ = np.empty((0, 0), np.float32)


class Undecided(Exception):
    """The candidates cannot prove this pick: it needs the whole row."""


def sort_candidates(
    ids: npt.NDArray[np.integer],
    values: npt.NDArray[np.float32],
    marked: npt.NDArray[np.int64] = NO_COLUMNS,
) -> tuple[Ids, npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Rows of candidates (one row of `ids`/`values` each) in the order the host path
    reads a cut: most likely first, lower ids first among equals; and whether each row
    holds any of the ids `marked`. llama.cpp leaves them in no order (its top_k swaps the
    first two on purpose; llama_srb/_cpu_cut.c's are in order already), so every row is
    sorted, all in one C call (sampling/_rows.c): numpy's sorts of each row cost more
    than its sampling. (The engine's call reads them in llama.cpp's buffers:
    DeviceCut.read.)"""
    ids = np.ascontiguousarray(ids, np.int32)
    values = np.ascontiguousarray(values, np.float32)
    out_ids, out_values = np.empty(ids.shape, np.int64), np.empty(values.shape, np.float32)
    holds = np.empty(ids.shape[:-1], np.bool_)
    marked = np.ascontiguousarray(marked, np.int64)
    k = ids.shape[-1]
    rows = list(range(len(holds)))
    _rows.sort_candidates(ids, values, k, rows, k, marked, out_ids, out_values, holds)
    return out_ids, out_values, holds


class DeviceRow:
    """`ids`/`values`: the device's candidates (any order); `complete`: they are every
    token of the vocabulary (nothing is off the list). `ordered`: they are in
    `sort_candidates`'s order already, the ids int64 (the engine orders a call's rows
    at once). `eog`: whether an end-of-generation token may be among them (False: a
    mask of them changes nothing here, and is not applied)."""

    __slots__ = ("_last_patch", "_saved", "eog", "floor", "ids", "values")

    def __init__(
        self,
        ids: npt.NDArray[np.integer],
        values: Vector,
        complete: bool = False,
        ordered: bool = False,
        eog: bool = True,
    ) -> None:
        if not ordered:
            (ids,), (values,), _ = sort_candidates(ids[None], values[None])
        self.ids: Ids = ids  # type: ignore[assignment]  # int64 when ordered, or made so
        self.values: Vector = values
        self.floor = -np.inf if complete or not len(values) else float(values[-1])
        self.eog = eog
        self._saved: tuple[Ids, Vector] | None = None
        # the last patch that moved a candidate: its arguments, then the row it made
        self._last_patch: tuple[Ids, Vector, Ids, Vector] | None = None

    @property
    def nbytes(self) -> int:
        """What the host read of llama.cpp's output for this row: ids and logits, 4 bytes
        each."""
        return 8 * len(self.ids)

    def read_maxima(self) -> None:
        """Nothing to read ahead: the candidates are the whole read."""

    @property
    def max(self) -> float:
        return float(self.values[0]) if len(self.values) else -np.inf

    def patch(self, ids: Ids, values: Vector) -> None:
        """Give tokens `ids` the logits `values` until `restore` (masked tokens: -inf).
        A token off the list stays below the floor only if lowered: raising one is a chain
        this row does not serve."""
        assert self._saved is None, "one patch at a time"
        self._saved = (self.ids, self.values)
        # a few ids (end of generation, banned tokens): one comparison of each with all
        hits = self.ids[:, None] == ids
        if not hits.any():  # the common case: none of them is among the candidates
            return
        last = self._last_patch
        if last is not None and last[0] is ids and last[1] is values:
            # the same mask again: a prompt's last row serves all its branches their first
            # tokens, each masking end of generation with the same arrays
            self.ids, self.values = last[2], last[3]
            return
        at = np.flatnonzero(hits.any(axis=1))
        sorter = np.argsort(ids)
        new = self.values.copy()
        new[at] = values[sorter[np.searchsorted(ids, self.ids[at], sorter=sorter)]]
        order = np.lexsort((self.ids, -new))
        self.ids, self.values = self.ids[order], new[order]
        self._last_patch = (ids, values, self.ids, self.values)

    def restore(self) -> None:
        if self._saved is not None:
            self.ids, self.values = self._saved
            self._saved = None

    def argmax(self) -> int:
        """The most likely token (the lowest id of equals), when it is above the floor."""
        if not len(self.values) or not self.values[0] > self.floor:
            raise Undecided
        return int(self.ids[0])

    def top_k(self, k: int) -> Cut:
        """The k most likely tokens, most likely first, when the candidates prove them."""
        v = self.values
        if k >= len(v) and self.floor > -np.inf:
            raise Undecided
        k = min(k, len(v))
        # equals inside the cut are in the host path's order (lowest id first); which of
        # equals at its edge the host path keeps is its own sort's
        if not v[k - 1] > self.floor or (k < len(v) and v[k] == v[k - 1]):
            raise Undecided
        return Cut(self.ids[:k], v[:k], NO_COLUMNS, NO_READ)

    def at_least(self, threshold: float) -> tuple[Ids, Vector]:
        """Every token whose logit is at least `threshold` (a min-p's kept set), most
        likely first, when the floor is below it: no token off the list reaches it."""
        if not len(self.values) or self.floor >= self.values.dtype.type(threshold):
            raise Undecided
        kept = self.values >= threshold  # float32 against the threshold, as the row compares
        return self.ids[kept], self.values[kept]

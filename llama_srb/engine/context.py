"""What the engine needs from llama.cpp, and no more: the real model and context
(llama_srb/native.py) satisfy these protocols, and so does the unit tests' fake, which
computes logits from a table (tests/unit/fake_context.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from llama_srb.native import Batch


class Vocabulary(Protocol):
    @property
    def n_vocab(self) -> int: ...

    @property
    def bos(self) -> int: ...

    @property
    def eog_tokens(self) -> tuple[int, ...]: ...


class DecodeContext(Protocol):
    """One context with a unified KV cache: decode a batch, read its logits, and tag or
    drop cells by sequence id, and save or load one sequence's cells."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_batch(self) -> int: ...

    def warm_up(self, token: int) -> None: ...

    def decode(self, batch: Batch) -> None:
        """Raises DecodeError when llama.cpp refuses the batch."""
        ...

    def logits(self) -> npt.NDArray[np.float32]:
        """The last decode's logits rows, in the order `Batch.add` numbered them,
        writable in place."""
        ...

    def candidate_buffers(
        self, rows: Sequence[int], k: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], int]:
        """Output rows' candidates from their sequences' device chains (backend sampling:
        engine/device_cut.py; rows ascending, each with a chain): a matrix of ids and one
        of logits with a row per output row, and how many of the first of each row are
        the candidates (at most k), in any order (raises NativeError when a row of `rows`
        has none)."""
        ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_pos_max(self, seq_id: int) -> int: ...

    def state_get(self, seq_id: int) -> bytes:
        """A sequence's cells as bytes (raises NativeError)."""
        ...

    def state_set(self, seq_id: int, data: bytes) -> bool:
        """Load `state_get`'s bytes into an empty sequence; False (still empty) if refused."""
        ...

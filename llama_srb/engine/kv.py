"""KV bookkeeping: which llama.cpp sequence ids are free and how many cells are promised.

Pure accounting with paired check/commit calls (`can_admit` / `admit`), so the scheduler
can be tested without a model. The engine applies the native side (`seq_rm`).
"""

from __future__ import annotations

from llama_srb.engine.sequence import Request, Sequence


class KvBudget:
    """Sequence ids and KV cells, reserved per request at admission.

    A request reserves its prompt's cells once plus `max_tokens` cells per branch (the
    unified cache shares prompt cells between forks). A branch that finishes returns its
    id and its cells at once; the prompt's cells return when the whole request ends.
    """

    def __init__(self, n_seq: int, n_cells: int) -> None:
        self.n_seq = n_seq
        self.n_cells = n_cells
        self._free_ids = list(range(n_seq - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.cells_reserved = 0

    @property
    def free_ids(self) -> int:
        return len(self._free_ids)

    def fits_ever(self, request: Request) -> bool:
        return request.n <= self.n_seq and request.cells_needed <= self.n_cells

    def can_admit(self, request: Request) -> bool:
        return (
            request.n <= len(self._free_ids)
            and self.cells_reserved + request.cells_needed <= self.n_cells
        )

    def admit(self, request: Request) -> None:
        assert self.can_admit(request)
        for seq in request.sequences:
            seq.seq_id = self._free_ids.pop()
        self.cells_reserved += request.cells_needed

    def release_sequence(self, request: Request, seq: Sequence) -> int:
        """Return a finished branch's id and cells; gives the id to clear natively."""
        seq_id, seq.seq_id = seq.seq_id, -1
        self._free_ids.append(seq_id)
        self.cells_reserved -= request.params.max_tokens
        return seq_id

    def release_prompt(self, request: Request) -> None:
        self.cells_reserved -= request.prompt_len

# The C loops of sampling/_rows.c (their docstrings say what each computes).
from typing import Any

def exp_sum(row: Any, top: float, scale: float) -> float: ...
def mask_row(row: Any, mask: Any, colmax: Any) -> None: ...
def top_k(values: Any, out: Any) -> None: ...
def head(values: Any, top: float, scale: float, target: float) -> float: ...
def sort_candidates(
    ids: Any,
    values: Any,
    stride: int,
    rows: list[int],
    k: int,
    marked: Any,
    out_ids: Any,
    out_values: Any,
    holds: Any,
) -> None: ...
def pick_candidates(
    ids: Any,
    values: Any,
    k: int,
    holds: Any,
    eog: Any,
    complete: bool,
    apply: int,
    accept: int,
    work: list[tuple[int, bool, tuple[int, int, int, float, float]]],
) -> list[int | None]: ...

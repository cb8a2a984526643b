"""Numbers in a request body must be finite doubles: NaN and Infinity (which Python's and
pydantic's JSON parsers accept, though JSON has no such values) and numbers beyond a
double's range (1e400, or a 400-digit integer: they become infinity in a float field)
are refused with a 400 that names the field, before the body reaches a sampler in C or
SQLite's JSON (which refuses them with an error of its own, a 500).

One check for every body (api/deps.py `parsed`): a scan of the raw bytes that costs less
than parsing them and rules most bodies out, then, only where the scan finds something
that might be such a number (or text that spells "NaN", "e400" or a long number), a parse
that says which field holds it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llama_srb.api.errors import APIError

DOUBLE_DIGITS = 309  # an integer of this many digits is beyond a double (max ≈ 1.8e308)
# A number beyond a double has a 3-digit exponent (1e400), or, its exponent at most 99,
# over 210 digits before its point: with digits read as 0 and E as e, the scan looks for
# these runs (bytes.translate and `in` run at memory speed; a regex is slower than a parse).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789E", b"000000000e")
_SUSPECT_RUNS = (b"e000", b"e+000", b"0" * 200)


def _suspect(raw: bytes) -> bool:
    """Whether `raw` might hold a number that is not finite (a superset: no false no)."""
    if b"NaN" in raw or b"Infinity" in raw:
        return True
    shapes = raw.translate(_DIGITS_AS_ZERO)
    return any(run in shapes for run in _SUSPECT_RUNS)


class _NotFinite(str):
    """A number's text as the client wrote it, where the number is not a finite double."""


def _float(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


def _int(text: str) -> int | _NotFinite:
    if len(text.lstrip("-")) >= DOUBLE_DIGITS and not math.isfinite(float(text)):
        return _NotFinite(text)
    return int(text)


def non_finite(raw: bytes) -> tuple[str, str] | None:
    """The first number of the JSON `raw` that is not a finite double: its field's path
    (`nodes[0].stats.x`) and its text as sent; None if every number is finite, or if
    `raw` is not JSON (pydantic says what is wrong with it)."""
    if not _suspect(raw):
        return None
    try:
        parsed = json.loads(raw, parse_float=_float, parse_int=_int, parse_constant=_NotFinite)
    except (ValueError, RecursionError):
        return None
    return _find(parsed)


def _find(value: Any) -> tuple[str, str] | None:
    """Depth first, in the document's order, without recursion (bodies may nest deep)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _NotFinite):
            return path, str(item)
        if isinstance(item, dict):
            children = [(f"{path}.{k}" if path else str(k), v) for k, v in item.items()]
        elif isinstance(item, list):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(item)]
        else:
            continue
        stack.extend(reversed(children))
    return None


def check_finite(raw: bytes) -> None:
    """A 400 naming the field of the body's first number that is not a finite double."""
    found = non_finite(raw)
    if found is None:
        return
    path, text = found
    where = f"`{path}`" if path else "the request body"
    raise APIError(
        400,
        f"{where}: {text[:40]} is not a finite number: a number must lie within ±1.8e308"
        " (a double's range), and JSON has no NaN or Infinity",
        param=path or None,
    )

"""A fixed-bucket histogram of plain ints, so the engine can record timings without
importing a metrics library; the API layer exports it (Prometheus `le` semantics)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# Seconds, 1 ms to 10 s: a decode step of one token per sequence up to a long prefill chunk.
STEP_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


# Seconds of a step outside llama_decode: tenths of a millisecond per branch when all is
# well, milliseconds per branch where the host, not the model, sets the pace.
HOST_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
# Seconds between two outputs of one stream: a decode step is tens of ms, a stall is more.
GAP_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# Seconds a request waits for admission: none at all up to minutes under overload.
WAIT_BUCKETS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


@dataclass
class Histogram:
    """Counts per bucket (the last one is +Inf) and the sum of observed values.

    Written by the engine thread only; other threads read copies it publishes.
    """

    bounds: tuple[float, ...] = STEP_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # first bound >= value: `le`
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, ending with (+inf, count)."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

"""The engine's counters, and the snapshot of them it publishes as it steps: what
/metrics reads (one reference assignment: other threads see an old snapshot or a new one,
whole, never the live bookkeeping)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llama_srb.engine.histogram import GAP_BUCKETS, HOST_BUCKETS, WAIT_BUCKETS, Histogram
from llama_srb.engine.tiers import TierCounters


@dataclass
class EngineStats:
    """Monotonic counters, read by /metrics and by tests (plain ints: no hot-path cost)."""

    steps: int = 0
    prompt_tokens_evaluated: int = 0  # prompt tokens actually run through llama_decode
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    prompt_tokens_cached: int = 0  # prompt tokens forked from cached or live sequences
    # Bytes of logits rows the host read out of llama.cpp's output to sample and score
    # (engine/sampling_stage.py): a whole row per row read.
    logits_bytes_read: int = 0
    # Backend sampling (engine/device_cut.py): rows read as the device's candidates; of
    # those, picks they could not prove (the whole row read after all); and of these,
    # rows decoded again for it (the call had no whole rows).
    device_rows: int = 0
    device_undecided: int = 0
    device_decoded_again: int = 0
    decode_step_seconds: Histogram = field(default_factory=Histogram)  # per llama_decode
    # Per step, the engine thread's time outside llama_decode: what a fast GPU exposes.
    host_step_seconds: Histogram = field(default_factory=lambda: Histogram(HOST_BUCKETS))
    # Per stream: from one output with tokens to its next (what a reader feels as a stall).
    token_gap_seconds: Histogram = field(default_factory=lambda: Histogram(GAP_BUCKETS))
    # From arrival to admission (sequence ids and cells granted), per request.
    queue_wait_seconds: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    # Steps whose head-of-queue request waited, by what it lacked.
    steps_short_of_sequences: int = 0
    steps_short_of_cells: int = 0
    # The prefix cache's lower tiers (engine/tiers.py), by tier name ("host", "disk").
    tier_hits: dict[str, int] = field(default_factory=dict)  # restores that worked
    tier_tokens_restored: dict[str, int] = field(default_factory=dict)
    tier_bytes_restored: dict[str, int] = field(default_factory=dict)
    tier_restore_seconds: dict[str, float] = field(default_factory=dict)
    tier_restore_failures: int = 0  # entries that did not load: those prompts were read
    tier_save_seconds: float = 0.0  # copying cached paths down

    def copy(self) -> EngineStats:
        """A copy whose histograms and tallies the engine thread will not change."""
        return replace(
            self,
            tier_hits=dict(self.tier_hits),
            tier_tokens_restored=dict(self.tier_tokens_restored),
            tier_bytes_restored=dict(self.tier_bytes_restored),
            tier_restore_seconds=dict(self.tier_restore_seconds),
            decode_step_seconds=self.decode_step_seconds.copy(),
            host_step_seconds=self.host_step_seconds.copy(),
            token_gap_seconds=self.token_gap_seconds.copy(),
            queue_wait_seconds=self.queue_wait_seconds.copy(),
        )


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's counters and gauges as of a recent step. The engine thread publishes a
    new one after every step that admits or ends a request or finds another one queued,
    and mid-stream at most every SNAPSHOT_SECONDS; other threads (/metrics) read only
    these, never the live bookkeeping, which the engine thread changes as it goes."""

    stats: EngineStats = field(default_factory=EngineStats)
    requests_running: int = 0
    requests_waiting: int = 0
    sequences_running: int = 0
    kv_cells_reserved: int = 0
    kv_cells_used: int = 0
    kv_cells_cached: int = 0
    kv_cells_total: int = 0
    tiers: TierCounters | None = None  # what the lower tiers hold (None: no tiers)

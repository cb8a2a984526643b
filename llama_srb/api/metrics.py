"""Prometheus exposition: the engine's counters, read at scrape time (no hot-path cost),
and the HTTP layer's own counters and histograms (requests by route and status, TTFT)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from llama_srb.api.connections import CUT_REASONS, OpenConnections
from llama_srb.engine.histogram import Histogram as EngineHistogram
from llama_srb.engine.stats import EngineSnapshot
from llama_srb.engine.watch import Watchdog

# Seconds from arrival to the first token, queueing and prefill included.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class ServerMetrics:
    """The app's own registry (no process-global state) and what the HTTP layer records."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http_requests = Counter(
            "llama_srb_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "llama_srb_time_to_first_token_seconds",
            "From a request's arrival to its first sampled token (queue + prefill)",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "llama_srb_request_duration_seconds",
            "From a generation request's arrival to its end, however it ended",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.requests_ended = Counter(
            "llama_srb_requests_ended",
            "Generation requests by how they ended"
            " (completed, error, timeout, shutdown, cancelled)",
            ["outcome"],
            registry=self.registry,
        )
        # Labelled by the configured keys' names (key-<n> for one without): a bounded set.
        self.key_requests = Counter(
            "llama_srb_key_requests",
            "Generation requests by API key name and how they ended",
            ["key", "outcome"],
            registry=self.registry,
        )
        self.key_tokens = Counter(
            "llama_srb_key_generated_tokens",
            "Tokens generated for each API key name",
            ["key"],
            registry=self.registry,
        )


def _histogram(name: str, doc: str, hist: EngineHistogram) -> HistogramMetricFamily:
    buckets = [
        (str(bound) if bound != float("inf") else "+Inf", n) for bound, n in hist.cumulative()
    ]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=hist.total)


class EngineCollector(Collector):
    """Reads the snapshot the engine thread publishes after each step, never live state."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        if snap is None:
            return
        stats = snap.stats
        yield CounterMetricFamily(
            "llama_srb_prompt_tokens_evaluated",
            "Prompt tokens run through llama_decode",
            value=stats.prompt_tokens_evaluated,
        )
        yield CounterMetricFamily(
            "llama_srb_prompt_tokens_cached",
            "Prompt tokens served from the prefix cache instead of being evaluated",
            value=stats.prompt_tokens_cached,
        )
        yield CounterMetricFamily(
            "llama_srb_generated_tokens", "Tokens sampled", value=stats.generated_tokens
        )
        yield CounterMetricFamily(
            "llama_srb_logits_bytes_read",
            "Bytes of logits the host read out of llama.cpp's output to sample and score"
            " (a whole row per row read; divide by generated tokens for bytes per branch-step)",
            value=stats.logits_bytes_read,
        )
        device = CounterMetricFamily(
            "llama_srb_backend_sampling_rows",
            "Rows read as the device's top-64 candidates (--backend-sampling), by what"
            " followed: decided by them, or read whole after all (undecided), of which"
            " decoded again (their call had no whole rows)",
            labels=["outcome"],
        )
        device.add_metric(["candidates"], stats.device_rows)
        device.add_metric(["undecided"], stats.device_undecided)
        device.add_metric(["decoded_again"], stats.device_decoded_again)
        yield device
        yield _histogram(
            "llama_srb_decode_step_seconds",
            "Duration of each llama_decode call (a step makes one or more: --tokens-per-call)",
            stats.decode_step_seconds,
        )
        yield _histogram(
            "llama_srb_host_step_seconds",
            "Per engine step, the time spent outside llama_decode (scheduling, sampling, text,"
            " outputs, and the KV cache's work for what the step before ended, done after its"
            " outputs went): on a fast GPU, this sets the pace when it is a large share of the"
            " step",
            stats.host_step_seconds,
        )
        yield _histogram(
            "llama_srb_token_gap_seconds",
            "Per stream, the time between two consecutive outputs with tokens",
            stats.token_gap_seconds,
        )
        yield _histogram(
            "llama_srb_queue_wait_seconds",
            "From a request's arrival to its admission (sequence ids and KV cells granted)",
            stats.queue_wait_seconds,
        )
        short = CounterMetricFamily(
            "llama_srb_admission_short_steps",
            "Steps in which the request whose turn it was waited, by what it lacked"
            " (sequences: the server's or its client's share)",
            labels=["lacking"],
        )
        short.add_metric(["sequences"], stats.steps_short_of_sequences)
        short.add_metric(["cells"], stats.steps_short_of_cells)
        yield short
        yield CounterMetricFamily(
            "llama_srb_decode_steps",
            "Engine steps that decoded (each makes one or more llama_decode calls)",
            value=stats.steps,
        )
        yield CounterMetricFamily(
            "llama_srb_decode_seconds", "Time spent in llama_decode", value=stats.decode_seconds
        )
        gauges = (
            ("llama_srb_requests_running", "Admitted requests", snap.requests_running),
            ("llama_srb_requests_waiting", "Queued requests", snap.requests_waiting),
            ("llama_srb_sequences_running", "Live sequences", snap.sequences_running),
            ("llama_srb_kv_cells_reserved", "KV cells promised", snap.kv_cells_reserved),
            (
                "llama_srb_kv_cells_used",
                "KV cells reserved by live requests or held by the prefix cache",
                snap.kv_cells_used,
            ),
            (
                "llama_srb_kv_cells_cached",
                "KV cells held by finished sequences in the prefix cache",
                snap.kv_cells_cached,
            ),
            ("llama_srb_kv_cells_total", "KV cells", snap.kv_cells_total),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        yield from _tier_metrics(snap)


TIERS = ("host", "disk")


def _tier_metrics(snap: EngineSnapshot) -> Iterator[Metric]:
    """The prefix cache's lower tiers (engine/tiers.py), by tier."""
    if snap.tiers is None:
        return
    stats = snap.stats
    counters = (
        ("llama_srb_cache_tier_hits", "Cached prefixes restored, by tier", stats.tier_hits),
        (
            "llama_srb_cache_tier_tokens_restored",
            "Prompt tokens restored instead of being read, by tier",
            stats.tier_tokens_restored,
        ),
        (
            "llama_srb_cache_tier_bytes_restored",
            "KV state bytes loaded into the live cells, by tier",
            stats.tier_bytes_restored,
        ),
        (
            "llama_srb_cache_tier_restore_seconds",
            "Time spent restoring cached prefixes (reading and loading), by tier",
            stats.tier_restore_seconds,
        ),
    )
    for name, doc, values in counters:
        family = CounterMetricFamily(name, doc, labels=["tier"])
        for tier in TIERS:
            family.add_metric([tier], values.get(tier, 0))
        yield family
    held = snap.tiers
    entries = GaugeMetricFamily(
        "llama_srb_cache_tier_entries", "Cached paths held, by tier", labels=["tier"]
    )
    nbytes = GaugeMetricFamily(
        "llama_srb_cache_tier_bytes", "KV state bytes held, by tier", labels=["tier"]
    )
    for kind, count in held.entries.items():
        entries.add_metric([kind.value], count)
        nbytes.add_metric([kind.value], held.bytes_held[kind])
    yield entries
    yield nbytes
    yield CounterMetricFamily(
        "llama_srb_cache_tier_saves", "Cached paths copied down to the tiers", value=held.saves
    )
    yield CounterMetricFamily(
        "llama_srb_cache_tier_bytes_saved", "KV state bytes copied down", value=held.bytes_saved
    )
    yield CounterMetricFamily(
        "llama_srb_cache_tier_restore_failures",
        "Tier entries that did not load (those prompts were read instead)",
        value=stats.tier_restore_failures,
    )


class WatchdogCollector(Collector):
    """The engine step in progress: its age and the steps that ran past --stuck-after."""

    def __init__(self, watchdog: Callable[[], Watchdog | None]) -> None:
        self._watchdog = watchdog

    def collect(self) -> Iterator[Metric]:
        watchdog = self._watchdog()
        if watchdog is None:
            return
        yield GaugeMetricFamily(
            "llama_srb_engine_step_age_seconds",
            "How long the engine's step in progress has run (0 between steps)",
            value=watchdog.age(),
        )
        yield GaugeMetricFamily(
            "llama_srb_engine_longest_step_seconds",
            "The longest engine step so far (its llama_decode calls and sampling)",
            value=watchdog.watch.longest,
        )
        yield GaugeMetricFamily(
            "llama_srb_engine_stuck",
            "1 while the step in progress has run past --stuck-after",
            value=float(watchdog.stuck() is not None),
        )
        yield CounterMetricFamily(
            "llama_srb_engine_stuck_steps",
            "Engine steps that ran past --stuck-after",
            value=watchdog.episodes,
        )


class ConnectionsCollector(Collector):
    """Open HTTP connections and those the server cut (api/connections.py)."""

    def __init__(self, connections: OpenConnections) -> None:
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        connections = self._connections
        yield GaugeMetricFamily(
            "llama_srb_connections_open", "Open HTTP connections", value=connections.total
        )
        cut = CounterMetricFamily(
            "llama_srb_connections_cut",
            "Connections closed by the server's limits, by reason",
            labels=["reason"],
        )
        for reason in CUT_REASONS:
            cut.add_metric([reason], connections.cut[reason])
        yield cut


class ModelsCollector(Collector):
    """Each model's state and loads (api/models.py); the engine's own samples above are
    those of the model used last."""

    def __init__(self, states: Callable[[], list[tuple[str, str, int]]]) -> None:
        self._states = states  # (name, state, loads so far) of every model

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "llama_srb_model_state", "1 for each model's state", labels=["model", "state"]
        )
        loads = CounterMetricFamily(
            "llama_srb_model_loads", "Loads of each model since the start", labels=["model"]
        )
        for name, now, count in self._states():
            state.add_metric([name, now], 1)
            loads.add_metric([name], count)
        yield state
        yield loads

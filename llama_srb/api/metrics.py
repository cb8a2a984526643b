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

from llama_srb.engine.engine import Engine
from llama_srb.engine.histogram import Histogram as EngineHistogram

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


def _histogram(name: str, doc: str, hist: EngineHistogram) -> HistogramMetricFamily:
    buckets = [
        (str(bound) if bound != float("inf") else "+Inf", n) for bound, n in hist.cumulative()
    ]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=hist.total)


class EngineCollector(Collector):
    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        if engine is None:
            return
        stats, scheduler = engine.stats, engine.scheduler
        running = list(scheduler.running)
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
        yield _histogram(
            "llama_srb_decode_step_seconds",
            "Duration of each llama_decode call (one engine step)",
            stats.decode_step_seconds,
        )
        yield CounterMetricFamily("llama_srb_decode_steps", "llama_decode calls", value=stats.steps)
        yield CounterMetricFamily(
            "llama_srb_decode_seconds", "Time spent in llama_decode", value=stats.decode_seconds
        )
        yield GaugeMetricFamily(
            "llama_srb_requests_running", "Admitted requests", value=len(running)
        )
        yield GaugeMetricFamily(
            "llama_srb_requests_waiting", "Queued requests", value=len(scheduler.waiting)
        )
        yield GaugeMetricFamily(
            "llama_srb_sequences_running",
            "Live sequences",
            value=sum(len(r.live) for r in running),
        )
        yield GaugeMetricFamily(
            "llama_srb_kv_cells_reserved",
            "KV cells promised",
            value=scheduler.budget.cells_reserved,
        )
        yield GaugeMetricFamily(
            "llama_srb_kv_cells_used",
            "KV cells reserved by live requests or held by the prefix cache",
            value=scheduler.budget.cells_used,
        )
        yield GaugeMetricFamily(
            "llama_srb_kv_cells_cached",
            "KV cells held by finished sequences in the prefix cache",
            value=scheduler.budget.cache.cells(),
        )
        yield GaugeMetricFamily(
            "llama_srb_kv_cells_total", "KV cells", value=scheduler.budget.n_cells
        )

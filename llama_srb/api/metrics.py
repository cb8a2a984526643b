"""Prometheus exposition of the engine's counters, read at scrape time (no hot-path cost)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llama_srb.engine.engine import Engine


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
            "llama_srb_generated_tokens", "Tokens sampled", value=stats.generated_tokens
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
            "llama_srb_kv_cells_total", "KV cells", value=scheduler.budget.n_cells
        )

"""One structured log line per generation request, plus its latency metrics.

The line is JSON (easy to grep and to ship): id, n, prompt/cached/generated tokens, time to
first token, total time, finish reasons and outcome. The prompt's text only with
--log-prompts: prompts are users' writing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from llama_srb.api.metrics import ServerMetrics
from llama_srb.engine.generation import Interrupted, RequestTimedOut
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.sequence import Request
from llama_srb.native import Model

log = logging.getLogger("llama_srb.requests")


@dataclass
class RequestRecord:
    request: Request
    reasons: list[str | None] = field(default_factory=list)
    outcome: str = "cancelled"  # until a final output or an interruption says otherwise
    error: str | None = None
    ended: bool = False

    def observe(self, output: RequestOutput) -> None:
        if not self.reasons:
            self.reasons = [None] * self.request.n
        for delta in output.choices:
            if delta.finish_reason is not None:
                self.reasons[delta.index] = delta.finish_reason.value
        if output.finished:
            self.outcome = "error" if output.error else "completed"
            self.error = output.error

    def line(self, prompt_text: str | None) -> str:
        request = self.request
        first = request.first_token_at
        fields: dict[str, object] = {
            "event": "request",
            "id": request.request_id,
            "outcome": self.outcome,
            "n": request.n,
            "prompt_tokens": request.prompt_len,
            "cached_tokens": request.n_cached,
            "generated_tokens": request.completion_tokens,
            "ttft_ms": None if first is None else round((first - request.arrival) * 1000, 1),
            "total_ms": round((time.monotonic() - request.arrival) * 1000, 1),
            "finish_reasons": self.reasons or [None] * request.n,
        }
        if self.error:
            fields["error"] = self.error
        if prompt_text is not None:
            fields["prompt"] = prompt_text
        return json.dumps(fields, ensure_ascii=False)


class RequestLog:
    """The records of one call's engine requests (one per prompt), fed as outputs pass:
    each request's line is logged, and its latency observed, once it ends."""

    def __init__(
        self, metrics: ServerMetrics, model: Model, log_prompts: bool, requests: Sequence[Request]
    ) -> None:
        self.metrics = metrics
        self.model = model
        self.log_prompts = log_prompts
        self.records = [RequestRecord(request) for request in requests]

    def observe(self, position: int, output: RequestOutput) -> None:
        record = self.records[position]
        if not record.reasons:  # the first output carries the first tokens
            self._first_token(record.request)
        record.observe(output)
        if output.finished:
            self._end(record)

    def interrupted(self, exc: Interrupted) -> None:
        """The runtime ended the call (timeout, shutdown): so ended every unfinished request."""
        for record in self.records:
            if not record.ended:
                record.outcome = "timeout" if isinstance(exc, RequestTimedOut) else "shutdown"
                record.error = str(exc)

    def close(self) -> None:
        """The call is over: what has not ended yet was cancelled (or interrupted)."""
        for record in self.records:
            self._end(record)

    def _first_token(self, request: Request) -> None:
        if request.first_token_at is not None:
            self.metrics.time_to_first_token.observe(request.first_token_at - request.arrival)

    def _end(self, record: RequestRecord) -> None:
        if record.ended:
            return
        record.ended = True
        request = record.request
        self.metrics.request_duration.observe(time.monotonic() - request.arrival)
        self.metrics.requests_ended.labels(record.outcome).inc()
        prompt = self.model.text(request.prompt) if self.log_prompts else None
        log.info("%s", record.line(prompt))

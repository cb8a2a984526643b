"""Refusing work the server should not take: a full queue (429) or a shutdown (503).

Checked before a request's sampler chains are built, so a refusal costs nothing. Admission
itself (live sequences, KV cells, strict arrival order) is the scheduler's business; this
only bounds how many accepted requests may wait for it.
"""

from __future__ import annotations

from llama_srb.api.errors import APIError
from llama_srb.engine.runtime import Runtime

# Seconds a refused client should wait: about one short generation on a busy server.
RETRY_AFTER_S = 1


def refuse_if_full(runtime: Runtime, max_queue: int, incoming: int = 1) -> None:
    """`incoming`: the engine requests this call will submit (one per prompt of a list)."""
    if runtime.closing:
        raise APIError(503, "the server is shutting down", code="server_shutting_down")
    if incoming > max_queue:
        raise APIError(
            400,
            f"this request carries {incoming} prompts, but at most {max_queue} requests may"
            " wait on this server (--max-queue): send fewer prompts per request",
            param="prompt",
        )
    waiting = runtime.waiting
    if waiting + incoming > max_queue:
        raise APIError(
            429,
            f"the server is busy: {waiting} requests are already waiting (queue limit"
            f" {max_queue}); retry after {RETRY_AFTER_S} s",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

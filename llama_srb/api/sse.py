"""Engine outputs → OpenAI responses: Server-Sent Event chunks, or one collected result."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from llama_srb.api.errors import sse_error
from llama_srb.engine.outputs import RequestOutput


@dataclass
class Collected:
    texts: list[str]
    reasons: list[str | None]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


async def collect_outputs(outputs: AsyncIterator[RequestOutput], n: int) -> Collected:
    """Drain a request's outputs into the final text and finish reason of each choice."""
    parts: list[list[str]] = [[] for _ in range(n)]
    result = Collected(texts=[], reasons=[None] * n)
    async for out in outputs:
        for delta in out.choices:
            parts[delta.index].append(delta.text)
            if delta.finish_reason is not None:
                result.reasons[delta.index] = delta.finish_reason.value
        result.prompt_tokens = out.prompt_tokens
        result.completion_tokens = out.completion_tokens
        result.cached_tokens = out.cached_tokens
        result.error = out.error
    result.texts = ["".join(p) for p in parts]
    return result


def sse(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


@dataclass
class CompletionStream:
    """SSE events of a /v1/completions stream: one chunk per engine step (all choices
    that advanced in it), a usage chunk on request, then `[DONE]`."""

    request_id: str
    created: int
    model: str
    include_usage: bool

    def _chunk(self, choices: list[dict[str, object]], usage: dict[str, int] | None = None) -> str:
        payload: dict[str, object] = {
            "id": self.request_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return sse(payload)

    async def events(self, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        last: RequestOutput | None = None
        async for out in outputs:
            last = out
            if out.error is not None:
                yield sse_error(out.error)
                break
            choices: list[dict[str, object]] = [
                {
                    "index": d.index,
                    "text": d.text,
                    "logprobs": None,
                    "finish_reason": d.finish_reason.value if d.finish_reason else None,
                }
                for d in out.choices
                if d.text or d.finish_reason is not None
            ]
            if choices:
                yield self._chunk(choices)
        if self.include_usage and last is not None:
            usage = {
                "prompt_tokens": last.prompt_tokens,
                "completion_tokens": last.completion_tokens,
                "total_tokens": last.prompt_tokens + last.completion_tokens,
            }
            yield self._chunk([], usage)
        yield "data: [DONE]\n\n"

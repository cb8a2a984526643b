"""Server-Sent Events, framed in one place: an event (named or not), an error event, the `[DONE]` that ends
OpenAI's streams, the streaming response itself, and the envelope of OpenAI's chunks (with
the usage they report, summed over a call's prompts)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi.responses import StreamingResponse

from llama_srb.api.errors import error_body, interrupted_error
from llama_srb.api.render.logprobs import Piece
from llama_srb.api.schemas.completions import Usage
from llama_srb.engine.generation import Interrupted
from llama_srb.engine.outputs import RequestOutput

DONE = "data: [DONE]\n\n"


def event(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def named_event(name: str, payload: object) -> str:
    """An event with a name line (KoboldCpp's `event: message`), `\n`-separated: KoboldAI
    Lite's parser matches exactly `event: …\ndata: …\n\n`."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def error_event(message: str, status: int = 500, code: str | None = None) -> str:
    return f"data: {json.dumps(error_body(status, message, code=code))}\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    # Starlette cancels `events` when the client disconnects, which aborts the request.
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        _ended_cleanly(events), media_type="text/event-stream", headers=headers
    )


async def _ended_cleanly(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """A stream the runtime interrupts (timeout, shutdown) still ends in OpenAI's way:
    an error event, then `[DONE]`; the status line went out long ago."""
    try:
        async for line in events:
            yield line
    except Interrupted as exc:
        error = interrupted_error(exc)
        yield error_event(error.message, error.status, error.code)
        yield DONE


@dataclass
class UsageTally:
    """Token counts summed over the prompts of a call (each output carries its totals)."""

    latest: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def add(self, position: int, out: RequestOutput) -> None:
        self.latest[position] = (out.prompt_tokens, out.completion_tokens, out.cached_tokens)

    def usage(self) -> Usage:
        prompt, completion, cached = (sum(v[i] for v in self.latest.values()) for i in range(3))
        return Usage.of(prompt, completion, cached)


@dataclass
class ChunkStream:
    request_id: str
    created: int
    model: str
    include_usage: bool
    n: int
    piece: Piece | None  # token text, when the client asked for logprobs

    object_name = ""

    def _chunk(self, choices: list[dict[str, object]], **extra: object) -> str:
        """One chunk; `extra`: its other fields (usage, prompt_progress)."""
        payload: dict[str, object] = {
            "id": self.request_id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        return event({**payload, **extra})

    def _each(self, choices: list[dict[str, object]]) -> str:
        """One chunk per choice, as OpenAI and llama.cpp's server send them: clients such as
        SillyTavern read only `choices[0]` of each event and route it by its `index`."""
        return "".join(self._chunk([choice]) for choice in choices)

    def _usage(self, usage: UsageTally) -> str:
        return self._chunk([], usage=usage.usage().model_dump())

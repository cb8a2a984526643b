"""Server-Sent Events, framed in one place: an event (named or not), the `[DONE]` that ends
OpenAI's streams, the one way every stream ends early (`guarded`: an error event with the
status, type and code the whole answer would carry), the streaming response itself, and
the envelope of OpenAI's chunks (with the usage they report, summed over a call's
prompts)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi.responses import StreamingResponse

from llama_srb.api.errors import APIError, Failure, api_error, body_for
from llama_srb.api.render.logprobs import Piece
from llama_srb.api.schemas.completions import Usage
from llama_srb.engine.generation import Interrupted
from llama_srb.engine.outputs import RequestOutput
from llama_srb.sampling.params import ParamError

DONE = "data: [DONE]\n\n"
log = logging.getLogger("llama_srb.api")


def event(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def named_event(name: str, payload: object) -> str:
    """An event with a name line (KoboldCpp's `event: message`), `\n`-separated: KoboldAI
    Lite's parser matches exactly `event: …\ndata: …\n\n`."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def error_event(failure: Failure, path: str = "") -> str:
    """What ended a stream early, as one event: the error object that the route would
    answer whole (errors.api_error: a request's own fault is a 4xx, the server's a 5xx),
    in the route's shape (`path`: KoboldCpp's under /api/, else OpenAI's)."""
    error = api_error(failure)
    body = body_for(path, error.status, error.message, error.param, error.code)
    return f"data: {json.dumps(body)}\n\n"


async def guarded(
    events: AsyncIterator[str], end: str = DONE, path: str = ""
) -> AsyncIterator[str]:
    """A stream's events, then `end` (OpenAI's `[DONE]`; nothing for llama.cpp's and
    KoboldCpp's streams, which just stop). Whatever stops it early (an output's error,
    raised by the renderer as `api_error(output)`; a timeout or shutdown; a bug) becomes
    one error event before `end`: the status line went out long ago."""
    try:
        async for line in events:
            yield line
    except Exception as exc:  # a disconnect's cancellation is not an Exception: it goes on
        if not isinstance(exc, APIError | Interrupted | ParamError):
            log.exception("a stream failed")
        yield error_event(exc, path)
    if end:
        yield end


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    """`events` as server-sent events; a renderer's events end through `guarded`.
    Starlette cancels `events` when the client disconnects, which aborts the request."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


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

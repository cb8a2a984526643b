"""Engine outputs → OpenAI's Server-Sent Event chunks, for completions and chat."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from llama_srb.api.choices import UsageTally, choice_index
from llama_srb.api.errors import sse_error
from llama_srb.api.logprob_format import Piece, chat_logprobs, completion_logprobs
from llama_srb.api.prompts import Prompt
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput

DONE = "data: [DONE]\n\n"


def sse(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


@dataclass
class _Stream:
    request_id: str
    created: int
    model: str
    include_usage: bool
    n: int
    piece: Piece | None  # token text, when the client asked for logprobs

    object_name = ""

    def _chunk(
        self, choices: list[dict[str, object]], usage: dict[str, object] | None = None
    ) -> str:
        payload: dict[str, object] = {
            "id": self.request_id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return sse(payload)

    def _each(self, choices: list[dict[str, object]]) -> str:
        """One chunk per choice, as OpenAI and llama.cpp's server send them: clients such as
        SillyTavern read only `choices[0]` of each event and route it by its `index`."""
        return "".join(self._chunk([choice]) for choice in choices)

    def _usage(self, usage: UsageTally) -> str:
        return self._chunk([], usage.usage().model_dump())


@dataclass
class CompletionStream(_Stream):
    """SSE events of a /v1/completions stream: with `echo`, each prompt's text first; then,
    per engine step, one chunk for each choice that advanced; a usage chunk on request,
    then `[DONE]`."""

    prompts: Sequence[Prompt] = ()
    echo: bool = False
    object_name = "text_completion"
    # per choice: where its next token's text starts in prompt + completion (text_offset)
    _offsets: dict[int, int] = field(default_factory=dict, init=False)

    async def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[str]:
        usage = UsageTally()
        echoed: set[int] = set()
        async for position, out in outputs:
            if out.error is not None:
                yield sse_error(out.error)
                break
            if self.echo and position not in echoed:
                echoed.add(position)
                yield self._each(self._echo(position, out))
            usage.add(position, out)
            choices = [
                self._choice(position, d)
                for d in out.choices
                if d.text or d.finish_reason is not None or d.logprobs
            ]
            if choices:
                yield self._each(choices)
        if self.include_usage and usage.latest:
            yield self._usage(usage)
        yield DONE

    def _echo(self, position: int, out: RequestOutput) -> list[dict[str, object]]:
        prompt = self.prompts[position]
        logprobs = None
        if self.piece is not None and out.prompt_logprobs is not None:
            entries = list(zip(prompt.tokens, out.prompt_logprobs, strict=True))
            logprobs = completion_logprobs(entries, self.piece, 0)[0].model_dump()
        return [
            {
                "index": position * self.n + i,
                "text": prompt.text,
                "logprobs": logprobs,
                "finish_reason": None,
            }
            for i in range(self.n)
        ]

    def _choice(self, position: int, delta: ChoiceDelta) -> dict[str, object]:
        index = choice_index(position, self.n, delta)
        logprobs = None
        if self.piece is not None and delta.logprobs:
            offset = self._offsets.get(index, len(self.prompts[position].text))
            entries = [(e.token, e) for e in delta.logprobs]
            formatted, self._offsets[index] = completion_logprobs(entries, self.piece, offset)
            logprobs = formatted.model_dump()
        reason = delta.finish_reason.value if delta.finish_reason else None
        return {"index": index, "text": delta.text, "logprobs": logprobs, "finish_reason": reason}


@dataclass
class ChatStream(_Stream):
    """SSE events of a /v1/chat/completions stream: each choice's `role` first, then its
    content deltas, then its finish reason; a usage chunk on request, then `[DONE]`."""

    object_name = "chat.completion.chunk"

    async def events(self, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        yield self._each(
            [self._entry(i, {"role": "assistant", "content": ""}) for i in range(self.n)]
        )
        usage = UsageTally()
        async for out in outputs:
            if out.error is not None:
                yield sse_error(out.error)
                break
            usage.add(0, out)
            content = [
                self._entry(d.index, {"content": d.text}, self._logprobs(d))
                for d in out.choices
                if d.text or d.logprobs
            ]
            if content:
                yield self._each(content)
            ended = [
                self._entry(d.index, {}, reason=d.finish_reason.value)
                for d in out.choices
                if d.finish_reason is not None
            ]
            if ended:
                yield self._each(ended)
        if self.include_usage and usage.latest:
            yield self._usage(usage)
        yield DONE

    @staticmethod
    def _entry(
        index: int,
        delta: dict[str, str],
        logprobs: dict[str, object] | None = None,
        reason: str | None = None,
    ) -> dict[str, object]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}

    def _logprobs(self, delta: ChoiceDelta) -> dict[str, object] | None:
        if self.piece is None or not delta.logprobs:
            return None
        content = chat_logprobs(delta.logprobs, self.piece)
        return {"content": [c.model_dump() for c in content], "refusal": None}

"""Engine outputs → /v1/chat/completions' answer: the SSE chunks of a stream, or the whole
chat completion."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from llama_srb.api.errors import api_error
from llama_srb.api.render.choices import gather
from llama_srb.api.render.logprobs import Piece, chat_logprobs
from llama_srb.api.render.sse import ChunkStream, UsageTally, guarded
from llama_srb.api.schemas.chat import AssistantMessage, ChatChoice, ChatCompletion, ChoiceLogprobs
from llama_srb.engine.outputs import ChoiceDelta, ChoiceSoFar, RequestOutput


@dataclass
class ChatAnswer(ChunkStream):
    """A /v1/chat/completions call's answer. Streamed: each choice's `role` first, then
    its content deltas, then its finish reason; a usage chunk on request, then `[DONE]`
    (an error event before it if the call fails). Whole: every choice (`collect`)."""

    object_name = "chat.completion.chunk"

    def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[str]:
        return guarded(self._stream(outputs))

    async def _stream(
        self, outputs: AsyncIterator[tuple[int, RequestOutput]]
    ) -> AsyncIterator[str]:
        yield self._each(
            [self._entry(i, {"role": "assistant", "content": ""}) for i in range(self.n)]
        )
        usage = UsageTally()
        async for _, out in outputs:
            if out.error is not None:
                raise api_error(out)
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

    async def collect(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> object:
        result = await gather(outputs, 1, self.n)
        completion = ChatCompletion(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[chat_choice(choice, self.piece) for choice in result.choices],
            usage=result.usage.usage(),
        )
        return completion.model_dump()


def chat_choice(choice: ChoiceSoFar, piece: Piece | None) -> ChatChoice:
    logprobs = None
    if piece is not None:
        logprobs = ChoiceLogprobs(content=chat_logprobs(choice.logprobs, piece))
    return ChatChoice(
        index=choice.index,
        message=AssistantMessage(content=choice.text),
        logprobs=logprobs,
        finish_reason=choice.finish_reason,
    )

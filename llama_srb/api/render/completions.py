"""Engine outputs → /v1/completions' answer: the SSE chunks of a stream, or the whole
completion. A call with p prompts and `n` has p*n choices (input/prompts.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from llama_srb.api.errors import api_error
from llama_srb.api.input.prompts import Prompt, choice_index, prompt_position
from llama_srb.api.render.choices import Gathered, gather
from llama_srb.api.render.logprobs import Piece, completion_logprobs, concat
from llama_srb.api.render.progress import PromptProgress
from llama_srb.api.render.sse import ChunkStream, UsageTally, guarded
from llama_srb.api.schemas.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
)
from llama_srb.engine.outputs import ChoiceDelta, ChoiceSoFar, RequestOutput
from llama_srb.sampling.logprobs import TokenLogprob


@dataclass
class CompletionAnswer(ChunkStream):
    """A /v1/completions call's answer. Streamed: with `echo`, each prompt's text first;
    then, per engine step, one chunk for each choice that advanced; a usage chunk on
    request, then `[DONE]` (an error event before it if the call fails). Whole: every
    choice (`collect`)."""

    prompts: Sequence[Prompt] = ()
    echo: bool = False
    progress: PromptProgress | None = None  # return_progress: chunks with prompt_progress
    object_name = "text_completion"
    # per choice: where its next token's text starts in the choice's text (text_offset)
    _offsets: dict[int, int] = field(default_factory=dict, init=False)

    def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[str]:
        return guarded(self._stream(outputs))

    async def _stream(
        self, outputs: AsyncIterator[tuple[int, RequestOutput]]
    ) -> AsyncIterator[str]:
        usage = UsageTally()
        echoed: set[int] = set()
        async for position, out in outputs:
            if out.error is not None:
                raise api_error(out)
            if self.echo and position not in echoed and (out.choices or out.finished):
                echoed.add(position)  # once its prompt is scored: with its first tokens
                yield self._each(self._echo(position, out))
            usage.add(position, out)
            read = self.progress.of(position, out) if self.progress is not None else None
            if read is not None:
                yield self._progress(position, read)
            choices = [
                self._choice(position, d)
                for d in out.choices
                if d.text or d.finish_reason is not None or d.logprobs
            ]
            if choices:
                yield self._each(choices)
        if self.include_usage and usage.latest:
            yield self._usage(usage)

    def _progress(self, position: int, read: dict[str, object]) -> str:
        """llama.cpp's own shape: an empty choice (of the prompt's first branch) beside
        `prompt_progress`, a field OpenAI's clients ignore."""
        choice = {"index": choice_index(position, self.n, 0), "text": "", "logprobs": None}
        return self._chunk([{**choice, "finish_reason": None}], prompt_progress=read)

    def _echo(self, position: int, out: RequestOutput) -> list[dict[str, object]]:
        prompt = self.prompts[position]
        logprobs = None
        if self.piece is not None and out.prompt_logprobs is not None:
            entries = list(zip(prompt.tokens, out.prompt_logprobs, strict=True))
            logprobs = completion_logprobs(entries, self.piece, 0)[0].model_dump()
        return [
            {
                "index": choice_index(position, self.n, i),
                "text": prompt.text,
                "logprobs": logprobs,
                "finish_reason": None,
            }
            for i in range(self.n)
        ]

    def _choice(self, position: int, delta: ChoiceDelta) -> dict[str, object]:
        index = choice_index(position, self.n, delta.index)
        logprobs = None
        if self.piece is not None and delta.logprobs:
            offset = self._offsets.get(index, len(self.prompts[position].text) if self.echo else 0)
            entries = [(e.token, e) for e in delta.logprobs]
            formatted, self._offsets[index] = completion_logprobs(entries, self.piece, offset)
            logprobs = formatted.model_dump()
        reason = delta.finish_reason.value if delta.finish_reason else None
        return {"index": index, "text": delta.text, "logprobs": logprobs, "finish_reason": reason}

    async def collect(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> object:
        result = await gather(outputs, len(self.prompts), self.n)
        completion = Completion(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=self._choices(result),
            usage=result.usage.usage(),
        )
        return completion.model_dump()

    def _choices(self, result: Gathered) -> list[CompletionChoice]:
        choices = []
        for choice in result.choices:
            position = prompt_position(choice.index, self.n)
            prompt = self.prompts[position]
            scores = result.prompt_logprobs[position] if self.echo else None
            logprobs = (
                _logprobs(choice, prompt, self.echo, scores, self.piece) if self.piece else None
            )
            choices.append(
                CompletionChoice(
                    index=choice.index,
                    text=prompt.text + choice.text if self.echo else choice.text,
                    logprobs=logprobs,
                    finish_reason=choice.finish_reason,
                )
            )
        return choices


def _logprobs(
    choice: ChoiceSoFar,
    prompt: Prompt,
    echo: bool,
    scores: list[TokenLogprob | None] | None,
    piece: Piece,
) -> CompletionLogprobs:
    """The choice's tokens (after the prompt's, with echo). `text_offset` indexes the
    choice's own `text`, as vLLM, Aphrodite and TabbyAPI answer and SillyTavern parses it
    (parseTabbyLogprobs cuts each token out of `choices[0].text`); with echo that text
    starts with the prompt, which is OpenAI's convention too."""
    generated = [(e.token, e) for e in choice.logprobs]
    tail = completion_logprobs(generated, piece, len(prompt.text) if echo else 0)[0]
    if scores is None:
        return tail
    head = completion_logprobs(list(zip(prompt.tokens, scores, strict=True)), piece, 0)[0]
    return concat(head, tail)

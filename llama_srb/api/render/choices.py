"""Engine outputs of one HTTP call (one or more prompts, n each) gathered whole into the
client's choices, for an answer that is not streamed (prompt i's branch j is choice i*n + j:
input/prompts.py's choice_index)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llama_srb.api.input.prompts import choice_index
from llama_srb.api.render.sse import UsageTally
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput
from llama_srb.sampling.logprobs import TokenLogprob


@dataclass
class ChoiceResult:
    index: int
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, delta: ChoiceDelta) -> None:
        self.parts.append(delta.text)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason.value


@dataclass
class Gathered:
    """A whole call's result: every choice, the prompts' scores (echo), usage, any error."""

    choices: list[ChoiceResult]
    prompt_logprobs: list[list[TokenLogprob | None] | None]
    usage: UsageTally = field(default_factory=UsageTally)
    error: str | None = None


async def gather(
    outputs: AsyncIterator[tuple[int, RequestOutput]], n_prompts: int, n: int
) -> Gathered:
    """Drain merged outputs into each choice's text, logprobs and finish reason."""
    result = Gathered(
        choices=[ChoiceResult(i) for i in range(n_prompts * n)],
        prompt_logprobs=[None] * n_prompts,
    )
    async for position, out in outputs:
        for delta in out.choices:
            result.choices[choice_index(position, n, delta.index)].add(delta)
        if out.prompt_logprobs is not None:
            result.prompt_logprobs[position] = out.prompt_logprobs
        result.usage.add(position, out)
        result.error = result.error or out.error
    return result

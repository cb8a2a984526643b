"""Engine outputs of one HTTP call (one or more prompts, n each) seen as the client's choices.

A call with p prompts and `n` has p*n choices; prompt i's branch j is choice i*n + j.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llama_srb.api.schemas.completions import Usage
from llama_srb.engine.outputs import ChoiceDelta, RequestOutput
from llama_srb.sampling.logprobs import TokenLogprob


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


def choice_index(position: int, n: int, branch: int) -> int:
    """The client's index of prompt `position`'s branch `branch` (its ChoiceDelta.index)."""
    return position * n + branch


def prompt_position(index: int, n: int) -> int:
    """The prompt a client's choice `index` continues: choice_index's inverse."""
    return index // n


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

"""Engine outputs of one HTTP call (one or more prompts, n each) gathered whole into the
client's choices, for an answer that is not streamed (prompt i's branch j is choice i*n + j:
input/prompts.py's choice_index)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llama_srb.api.errors import api_error
from llama_srb.api.input.prompts import choice_index
from llama_srb.api.render.sse import UsageTally
from llama_srb.engine.outputs import ChoiceSoFar, RequestOutput
from llama_srb.sampling.logprobs import TokenLogprob


@dataclass
class Gathered:
    """A whole call's result: every choice, the prompts' scores (echo), usage."""

    choices: list[ChoiceSoFar]
    prompt_logprobs: list[list[TokenLogprob | None] | None]
    usage: UsageTally = field(default_factory=UsageTally)


async def gather(
    outputs: AsyncIterator[tuple[int, RequestOutput]], n_prompts: int, n: int
) -> Gathered:
    """Drain merged outputs into each choice; an output's error is raised (errors.api_error)."""
    result = Gathered(
        choices=[ChoiceSoFar(i) for i in range(n_prompts * n)],
        prompt_logprobs=[None] * n_prompts,
    )
    async for position, out in outputs:
        if out.error is not None:
            raise api_error(out)
        for delta in out.choices:
            index = choice_index(position, n, delta.index)
            result.choices += [ChoiceSoFar(i) for i in range(len(result.choices), index + 1)]
            result.choices[index].add(delta)
        if out.prompt_logprobs is not None:
            result.prompt_logprobs[position] = out.prompt_logprobs
        result.usage.add(position, out)
    return result

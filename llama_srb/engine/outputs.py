"""What the engine returns from each step: per request, the new text of each choice."""

from __future__ import annotations

from dataclasses import dataclass, field

from llama_srb.engine.sequence import FinishReason
from llama_srb.sampling.logprobs import TokenLogprob


@dataclass
class ChoiceDelta:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked
    # 1 when the branch's newest token was sampled this step (it has no KV cell yet).
    # token_ids are the tokens released to the client, which text held back can delay.
    undecoded: int = 0


@dataclass
class RequestOutput:
    request_id: str
    choices: list[ChoiceDelta]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finished: bool = False
    error: str | None = None
    # echo + logprobs: one per prompt token, None where there is none (the first token)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # While a long prompt is read in chunks: its tokens in the KV cache so far (cached ones
    # included). Set only on these progress outputs, which carry no choices.
    prompt_processed: int | None = None

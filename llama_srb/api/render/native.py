"""Engine outputs → llama.cpp's /completion results and stream events, in llama-server's
field names and types (tools/server/server-task.cpp: `to_json_non_oaicompat`).

Each of the call's p*n results has an `index` (prompt position*n + branch). A stream
sends one event per generated token of a result (`content`, `tokens`, `stop: false`) and,
when the result ends, one with `stop: true`, `stop_type`, `stopping_word`, the token counts
and `timings`. Without streaming each result is one object; several make a JSON array.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from llama_srb.api.errors import api_error
from llama_srb.api.input.prompts import Prompt, choice_index, prompt_position
from llama_srb.api.render.logprobs import TokenText
from llama_srb.api.render.progress import PromptProgress
from llama_srb.api.render.sse import event, guarded
from llama_srb.engine.outputs import ChoiceDelta, ChoiceSoFar, FinishReason, RequestOutput
from llama_srb.sampling.chain import DEFAULT_ORDER
from llama_srb.sampling.logprobs import TokenLogprob
from llama_srb.sampling.params import SamplingParams

RANDOM_SEED = 0xFFFFFFFF  # what llama-server reports for "no seed given" (-1 as uint32)


@dataclass(frozen=True)
class NativeOptions:
    """What shapes the answer, beside the sampling parameters."""

    model: str
    n: int
    n_probs: int = 0
    post_sampling_probs: bool = False
    return_tokens: bool = False
    stream: bool = False
    samplers: tuple[str, ...] = ()


@dataclass
class NativeCall:
    """One /completion call: its prompts, options and results, rendered either way."""

    options: NativeOptions
    params: SamplingParams
    prompts: Sequence[Prompt]
    vocab: TokenText
    started: float = field(default_factory=time.perf_counter)
    results: dict[int, ChoiceSoFar] = field(default_factory=dict)
    cached: dict[int, int] = field(default_factory=dict)  # per prompt position
    progress: PromptProgress | None = None  # return_progress: events with prompt_progress

    # -- reading the engine's outputs ---------------------------------------------------

    def _deltas(self, position: int, out: RequestOutput) -> list[tuple[ChoiceSoFar, ChoiceDelta]]:
        now = time.perf_counter()
        self.cached[position] = out.cached_tokens
        seen = []
        for delta in out.choices:
            index = choice_index(position, self.options.n, delta.index)
            result = self.results.setdefault(index, ChoiceSoFar(index))
            result.add(delta, now)
            seen.append((result, delta))
        return seen

    async def collect(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> Any:
        """The whole answer: one result object, or a list of them (n > 1 or several
        prompts), ordered by index, as llama-server answers."""
        async for position, out in outputs:
            if out.error is not None:
                raise api_error(out)
            self._deltas(position, out)
        finals = [self.final(self.results[i]) for i in sorted(self.results)]
        return finals[0] if len(finals) == 1 else finals

    def events(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[str]:
        """Server-sent events: each token of each result, then its final event. No
        `[DONE]`: llama-server's native stream just ends (after an error event, if the
        call fails)."""
        return guarded(self._stream(outputs), end="")

    async def _stream(
        self, outputs: AsyncIterator[tuple[int, RequestOutput]]
    ) -> AsyncIterator[str]:
        async for position, out in outputs:
            if out.error is not None:
                raise api_error(out)
            read = self.progress.of(position, out) if self.progress is not None else None
            if read is not None:
                yield event(self.progress_event(position, read))
            for result, delta in self._deltas(position, out):
                if delta.text or delta.token_ids:
                    yield event(self.partial(result, delta))
                if delta.finish_reason is not None:
                    yield event(self.final(result))

    # -- rendering ------------------------------------------------------------------------

    @cached_property
    def settings(self) -> dict[str, Any]:
        """`generation_settings`: one for all the call's results (64 alike at n = 64)."""
        return generation_settings(self.params, self.options)

    def _position(self, result: ChoiceSoFar) -> int:
        return prompt_position(result.index, self.options.n)

    def partial(self, result: ChoiceSoFar, delta: ChoiceDelta) -> dict[str, Any]:
        event: dict[str, Any] = {
            "index": result.index,
            "content": delta.text,
            "tokens": delta.token_ids,
            "stop": False,
            "id_slot": result.index,
            "tokens_predicted": len(result.token_ids),
            "tokens_evaluated": len(self.prompts[self._position(result)].tokens),
        }
        if self.options.n_probs > 0 and delta.logprobs:
            event["completion_probabilities"] = self.probabilities(delta.logprobs)
        return event

    def progress_event(self, position: int, read: dict[str, Any]) -> dict[str, Any]:
        """llama-server's partial result with `prompt_progress` and no token yet, for
        the prompt's first result (its n results share one read)."""
        index = choice_index(position, self.options.n, 0)
        return {
            "index": index,
            "content": "",
            "tokens": [],
            "stop": False,
            "id_slot": index,
            "tokens_predicted": 0,
            "tokens_evaluated": len(self.prompts[position].tokens),
            "prompt_progress": read,
        }

    def final(self, result: ChoiceSoFar) -> dict[str, Any]:
        prompt = self.prompts[self._position(result)]
        stop_type, word = stop_info(result, self.params.stop, self.vocab.text)
        stream = self.options.stream
        content = "" if stream else result.text  # a stream sent it already
        body: dict[str, Any] = {
            "index": result.index,
            "content": content,
            "tokens": result.token_ids if self.options.return_tokens and not stream else [],
            "id_slot": result.index,
            "stop": True,
            "model": self.options.model,
            "tokens_predicted": len(result.token_ids),
            "tokens_evaluated": len(prompt.tokens),
            "generation_settings": self.settings,
            "prompt": prompt.text,
            "has_new_line": "\n" in result.text,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": self.cached.get(self._position(result), 0),
            "timings": self.timings(result, len(prompt.tokens)),
        }
        if not stream and self.options.n_probs > 0:
            body["completion_probabilities"] = self.probabilities(result.logprobs)
        return body

    def timings(self, result: ChoiceSoFar, prompt_tokens: int) -> dict[str, Any]:
        """llama-server's `timings`. The prompt's time runs from the call to the result's
        first token (queueing included); the rest is generation."""
        cached = self.cached.get(self._position(result), 0)
        first = result.first_at if result.first_at is not None else self.started
        ended = result.ended_at if result.ended_at is not None else time.perf_counter()
        prompt_n, predicted_n = prompt_tokens - cached, len(result.token_ids)
        prompt_ms, predicted_ms = (first - self.started) * 1000, (ended - first) * 1000
        return {
            "cache_n": cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1000 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
        }

    def probabilities(self, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """`completion_probabilities`: per token its id, text, bytes and log-probability,
        and the `n_probs` most likely tokens. With `post_sampling_probs` the values are
        probabilities (`prob`, `top_probs`); either way they are the model's own, before
        the sampler chain (docs/api.md, "Log-probabilities")."""
        post = self.options.post_sampling_probs
        top_key = "top_probs" if post else "top_logprobs"
        return [
            {
                **self._token(entry.token, entry.logprob),
                top_key: [self._token(t, lp) for t, lp in entry.top[: self.options.n_probs]],
            }
            for entry in entries
        ]

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        raw = self.vocab.piece(token)
        value = math.exp(logprob) if self.options.post_sampling_probs else logprob
        return {
            "id": token,
            "token": raw.decode("utf-8", errors="ignore"),  # llama-server: the valid part
            "bytes": list(raw),
            "prob" if self.options.post_sampling_probs else "logprob": value,
        }


def stop_info(
    result: ChoiceSoFar, stops: Sequence[str], text: Callable[[Sequence[int]], str]
) -> tuple[str, str]:
    """llama-server's `stop_type` ("eos", "word", "limit", or "none" while running) and
    `stopping_word`. A stop string ends a result right after the text it held back: the
    result's own tokens spell its content, then the stop string."""
    if result.finish_reason is FinishReason.LENGTH:
        return "limit", ""
    if result.finish_reason is not FinishReason.STOP:
        return "none", ""
    spelled = text(result.token_ids)
    tail = spelled[len(result.text) :]
    if tail and stops:
        word = next((s for s in stops if tail.startswith(s)), None)
        if word is None:  # a stop cut inside a character: the earliest one in the tail
            found = [(tail.find(s), s) for s in stops if s in tail]
            word = min(found)[1] if found else None
        if word is not None:
            return "word", word
    return "eos", ""


def generation_settings(params: SamplingParams, options: NativeOptions) -> dict[str, Any]:
    """The settings a result was generated with, under llama-server's names."""
    return {
        "n_predict": params.max_tokens,
        "max_tokens": params.max_tokens,
        "seed": params.seed if params.seed is not None else RANDOM_SEED,
        "temperature": params.temperature,
        "dynatemp_range": params.dynatemp_range,
        "dynatemp_exponent": params.dynatemp_exponent,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "top_n_sigma": params.top_n_sigma,
        "xtc_probability": params.xtc_probability,
        "xtc_threshold": params.xtc_threshold,
        "typical_p": params.typical_p,
        "repeat_last_n": params.repeat_last_n,
        "repeat_penalty": params.repeat_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "dry_multiplier": params.dry_multiplier,
        "dry_base": params.dry_base,
        "dry_allowed_length": params.dry_allowed_length,
        "dry_penalty_last_n": params.dry_penalty_last_n,
        "dry_sequence_breakers": list(params.dry_sequence_breakers),
        "mirostat": params.mirostat,
        "mirostat_tau": params.mirostat_tau,
        "mirostat_eta": params.mirostat_eta,
        "stop": list(params.stop),
        "n_keep": 0,
        "n_discard": 0,
        "ignore_eos": params.ignore_eos,
        "stream": options.stream,
        "logit_bias": [{"bias": bias, "token": token} for token, bias in params.logit_bias],
        "n_probs": options.n_probs,
        "min_keep": 0,
        "min_tokens": params.min_tokens,
        "grammar": _constraint_text(params),
        "samplers": list(options.samplers or DEFAULT_ORDER),
        "post_sampling_probs": options.post_sampling_probs,
        "timings_per_token": False,
        "n": options.n,
    }


def _constraint_text(params: SamplingParams) -> str:
    """The grammar a result was constrained by, as the client wrote it (a JSON schema's
    grammar is llguidance's own, not reported)."""
    source = params.constraint.spec.source if params.constraint is not None else ""
    return source if isinstance(source, str) else ""

"""Prompt lists: each prompt becomes its own engine request with `n` branches.

The engine batches concurrent requests already, so the prompts of one call run together;
here they are checked, built all at once (any error is a 400 before one is queued), and
their outputs merged into one stream tagged with the prompt's position.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import cast

from llama_srb.api.errors import APIError
from llama_srb.api.serving import build, discard
from llama_srb.engine.outputs import RequestOutput
from llama_srb.engine.sequence import Request as EngineRequest
from llama_srb.loader import LoadedEngine
from llama_srb.native import Model
from llama_srb.sampling.params import SamplingParams

# Bounds the native objects (sampler chains) one HTTP call can make the server build.
MAX_PROMPTS = 256

RawPrompt = str | list[str] | list[int] | list[list[int]]


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str  # what `echo` returns: the client's string, or the token ids' text


# Natural text takes about 4 bytes a token. Past 16 bytes for every cell of the context a
# text cannot fit, and llama.cpp's tokenizer grows quadratically with the special tokens
# (`<start_of_turn>`) in a text: 32,000 of them took 2.8 s here, 450,000 minutes.
MAX_BYTES_PER_TOKEN = 16


def tokenize_text(
    model: Model, text: str, n_ctx: int, param: str, add_special: bool = True
) -> list[int]:
    """`text` as tokens (special tokens' spellings read as those tokens), refused with a
    400 first if it is too long to fit in the context (`n_ctx` cells) whatever it holds."""
    size, most = len(text.encode("utf-8", "replace")), n_ctx * MAX_BYTES_PER_TOKEN
    if size > most:
        raise APIError(
            400,
            f"the text is {size} bytes: more than fits in this server's context of {n_ctx}"
            f" tokens (at most {most} bytes are read)",
            param=param,
            code="context_length_exceeded",
        )
    return model.tokenize(text, add_special, parse_special=True)


def parse_prompts(raw: RawPrompt, model: Model, n_ctx: int) -> list[Prompt]:
    """The prompts of a request, tokenized and checked (token ids must be in the vocabulary)."""
    if isinstance(raw, str):
        return [Prompt(tokenize_text(model, raw, n_ctx, "prompt"), raw)]
    if not raw:
        raise APIError(400, "the prompt list is empty", param="prompt")
    if all(isinstance(t, int) for t in raw):
        return [_token_prompt(cast(list[int], raw), model)]
    if len(raw) > MAX_PROMPTS:
        raise APIError(400, f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    return [
        Prompt(tokenize_text(model, p, n_ctx, "prompt"), p)
        if isinstance(p, str)
        else _token_prompt(p, model)
        for p in cast(list[str] | list[list[int]], raw)
    ]


def _token_prompt(tokens: list[int], model: Model) -> Prompt:
    error = model.vocab_error(tokens)
    if error is not None:
        raise APIError(400, error, param="prompt")
    return Prompt(tokens, model.text(tokens))


def count_prompts(raw: RawPrompt) -> int:
    """How many engine requests a `prompt` field makes, read from its shape alone."""
    if isinstance(raw, str) or all(isinstance(t, int) for t in raw):
        return 1
    return len(raw)


def build_all(
    loaded: LoadedEngine,
    n: int,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    prefix: str,
    prompt_logprobs: bool = False,
) -> list[EngineRequest]:
    """One engine request per prompt; if any cannot be built, none is kept."""
    requests: list[EngineRequest] = []
    try:
        for prompt in prompts:
            requests.append(build(loaded, n, prompt.tokens, params, prefix, prompt_logprobs))
    except BaseException:
        discard(requests)
        raise
    return requests


async def merge(
    streams: Sequence[AsyncIterator[RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The outputs of several requests as they come, each with its stream's position.

    Leaving early (disconnect, cancellation) cancels every stream, which aborts its request.
    """
    if len(streams) == 1:  # the usual case: no tasks, cancellation reaches the stream itself
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(position: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                queue.put_nowait((position, out))
        except Exception as exc:  # handed to the consumer, not lost in a task
            queue.put_nowait((position, exc))
        finally:
            queue.put_nowait((position, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            position, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield position, item
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)

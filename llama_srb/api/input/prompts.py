"""A request's text as tokens: `prompt` (a string, token ids, or a list of either),
tokenized and checked before anything is built. Each prompt becomes its own engine request
with `n` branches (input/params.py builds them): a call with p prompts and `n` has p*n
choices, and prompt i's branch j is choice i*n + j.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from llama_srb.api.errors import APIError
from llama_srb.api.schemas.sampling import RawPrompt
from llama_srb.served import Tokenizer

# Bounds the native objects (sampler chains) one HTTP call can make the server build.
MAX_PROMPTS = 256


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str  # what `echo` returns: the client's string, or the token ids' text


# Natural text takes about 4 bytes a token. Past 16 bytes for every cell of the context a
# text cannot fit, and llama.cpp's tokenizer grows quadratically with the special tokens
# (`<start_of_turn>`) in a text: 32,000 of them took 2.8 s here, 450,000 minutes.
MAX_BYTES_PER_TOKEN = 16


def tokenize_text(
    model: Tokenizer, text: str, n_ctx: int, param: str, add_special: bool = True
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


def parse_prompts(raw: RawPrompt, model: Tokenizer, n_ctx: int) -> list[Prompt]:
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


def _token_prompt(tokens: list[int], model: Tokenizer) -> Prompt:
    error = model.vocab_error(tokens)
    if error is not None:
        raise APIError(400, error, param="prompt")
    return Prompt(tokens, model.text(tokens))


def count_prompts(raw: RawPrompt) -> int:
    """How many engine requests a `prompt` field makes, read from its shape alone."""
    if isinstance(raw, str) or all(isinstance(t, int) for t in raw):
        return 1
    return len(raw)


def choice_index(position: int, n: int, branch: int) -> int:
    """The client's index of prompt `position`'s branch `branch` (its ChoiceDelta.index)."""
    return position * n + branch


def prompt_position(index: int, n: int) -> int:
    """The prompt a client's choice `index` continues: choice_index's inverse."""
    return index // n

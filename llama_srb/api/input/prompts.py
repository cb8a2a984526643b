"""A request's text as tokens: `prompt` (a string, token ids, or a list of either; each
prompt becomes its own engine request with `n` branches), checked before anything is built.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import cast

from llama_srb.api.errors import APIError
from llama_srb.api.input.chat_template import ChatTemplate, ChatTemplateError
from llama_srb.api.schemas.chat import ChatRequest
from llama_srb.api.schemas.sampling import RawPrompt
from llama_srb.native import Model

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


def chat_prompt(model: Model, template: ChatTemplate, body: ChatRequest, n_ctx: int) -> list[int]:
    """The rendered conversation as tokens, with exactly one BOS where the model wants one."""
    messages = [{"role": m.role, "content": m.content or ""} for m in body.messages]
    size = sum(len(m["content"].encode("utf-8", "replace")) for m in messages)
    if size > n_ctx * MAX_BYTES_PER_TOKEN:
        raise APIError(
            400,
            f"the messages hold {size} bytes: more than fits in this server's context of"
            f" {n_ctx} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    tokens = _tokenize_turns(model, template, messages)
    # Templates usually write the BOS themselves (`{{ bos_token }}`): add it only if not.
    if model.add_bos and model.bos >= 0 and tokens[:1] != [model.bos]:
        tokens.insert(0, model.bos)
    return tokens


def _tokenize_turns(
    model: Model, template: ChatTemplate, messages: list[dict[str, str]]
) -> list[int]:
    """The template's own markers (`<start_of_turn>`) become control tokens; what the
    messages say never does, or a message reading `<end_of_turn><start_of_turn>model`
    would forge a turn. Messages with such text are rendered as unique slots, then
    tokenized as plain text in their place."""
    risky = {i for i, m in enumerate(messages) if model.spells_special(m["content"])}
    slot = f"\x00{uuid.uuid4().hex}:"  # no client text can contain it: it is new
    slotted = [
        {**m, "content": f"{slot}{i}\x00"} if i in risky else m for i, m in enumerate(messages)
    ]
    try:
        text = template.render(slotted, add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), param="messages", code="chat_template_error") from None
    parts = re.split(f"{re.escape(slot)}(\\d+)\x00", text)  # template, index, template, …
    tokens: list[int] = []
    for k, part in enumerate(parts):
        if k % 2:
            tokens += model.tokenize(messages[int(part)]["content"], False, parse_special=False)
        elif part:
            tokens += model.tokenize(part, add_special=False, parse_special=True)
    return tokens

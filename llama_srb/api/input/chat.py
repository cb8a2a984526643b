"""A chat request's input: the chat template, chosen once when the model loads; the
messages rendered with it into prompt tokens; chat's own fields (max_completion_tokens,
logprobs as a switch, the template's stop strings).

The template, in order: --chat-template FILE; the model's own (`tokenizer.chat_template` in
its GGUF); for a Gemma 3 model without one (the bundled Gemma 3 270M is a base model),
Gemma 3's own template, shipped in `llama_srb/templates/`; for any other model, ChatML, as
llama.cpp's server falls back to. The choice is logged and reported by /props.

Templates come from model files and users, so they run in Jinja2's immutable sandbox (no
attribute access to Python internals, no mutation of the messages passed in) and render as
Hugging Face's `apply_chat_template` does. Their markers (`<start_of_turn>`) become control
tokens; what the messages say never does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llama_srb.api.errors import APIError
from llama_srb.api.input.params import request_params, with_default_length
from llama_srb.api.input.prompts import MAX_BYTES_PER_TOKEN
from llama_srb.api.input.turns import FOLDS
from llama_srb.api.schemas.chat import ChatRequest
from llama_srb.native import Model
from llama_srb.sampling.params import MAX_STOPS, ParamError, SamplingParams
from llama_srb.served import Tokenizer

log = logging.getLogger(__name__)

# general.architecture values whose family template is shipped in the package
FAMILY_TEMPLATES = {"gemma3": "gemma3.jinja"}
CHATML = "chatml.jinja"
# ChatML's end of turn: a stop string for models that do not know it as a token
CHATML_STOPS = ("<|im_end|>",)


def packaged(name: str) -> str:
    return (resources.files("llama_srb") / "templates" / name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class ServedTemplate:
    source: str  # the Jinja text, as /props reports it
    origin: str  # where it came from, in words
    stops: tuple[str, ...] = ()  # stop strings the template's turns need
    template: ChatTemplate | None = None
    error: str | None = None  # why it does not compile

    def get(self) -> ChatTemplate:
        if self.template is None:
            raise APIError(400, self.error or "no chat template", code="chat_template_invalid")
        return self.template


def choose(path: Path | None, model: Model) -> tuple[str, str, tuple[str, ...]]:
    """The template's source, where it came from, and the stops it needs."""
    if path is not None:
        return path.read_text(encoding="utf-8"), f"the file {path}", ()
    own = model.metadata("tokenizer.chat_template")
    if own:
        return own, "the model's own (tokenizer.chat_template)", ()
    arch = model.metadata("general.architecture") or ""
    family = FAMILY_TEMPLATES.get(arch)
    if family is not None:
        return packaged(family), f"{arch}'s, shipped with llama-srb (the model has none)", ()
    return packaged(CHATML), "ChatML, the fallback (the model has none)", CHATML_STOPS


def serve_template(path: Path | None, model: Model) -> ServedTemplate:
    source, origin, stops = choose(path, model)
    bos, eos = model.special_text(model.bos), model.special_text(model.eos)
    try:
        compiled = ChatTemplate(source, bos, eos)
    except ChatTemplateError as exc:
        log.error("chat template from %s: %s", origin, exc)
        return ServedTemplate(source, origin, stops, error=str(exc))
    log.info("chat template: %s", origin)
    return ServedTemplate(source, origin, stops, compiled)


# -- rendering, in a sandbox ---------------------------------------------------------------


class ChatTemplateError(ValueError):
    """The template does not compile, rejects the messages, or fails while rendering."""


class _Rejected(jinja2.TemplateError):
    """What a template's `raise_exception(...)` raises: the template's own message."""


class TemplateRejected(ChatTemplateError):
    """The template refused the messages (its `raise_exception`): folding them may help."""


def _raise_exception(message: str) -> None:
    raise _Rejected(message)


def _tojson(value: Any, indent: int | None = None, **kwargs: Any) -> str:
    # As transformers defines it: non-ASCII kept as is, unlike Jinja2's own tojson.
    return json.dumps(value, ensure_ascii=False, indent=indent, **kwargs)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"the chat template does not compile: {exc.message} (line {exc.lineno})"
            ) from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for `messages`; ChatTemplateError says why when there is none."""
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except _Rejected as exc:
            raise TemplateRejected(f"the chat template rejected the messages: {exc}") from None
        except Exception as exc:  # a template is code: any failure is the template's
            raise ChatTemplateError(
                f"the chat template failed: {type(exc).__name__}: {exc}"
            ) from None


# -- a request's messages → tokens, and chat's own fields -----------------------------------


def chat_prompt(
    model: Tokenizer, template: ChatTemplate, body: ChatRequest, n_ctx: int
) -> list[int]:
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
    model: Tokenizer, template: ChatTemplate, messages: list[dict[str, str]]
) -> list[int]:
    """The template's own markers (`<start_of_turn>`) become control tokens; what the
    messages say never does, or a message reading `<end_of_turn><start_of_turn>model`
    would forge a turn. Messages with such text are rendered as unique slots, then
    tokenized as plain text in their place."""
    slot = f"\x00{uuid.uuid4().hex}:"  # no client text can contain it: it is new
    messages, text = render_folded(template, messages, slot, model.spells_special)
    parts = re.split(f"{re.escape(slot)}(\\d+)\x00", text)  # template, index, template, …
    tokens: list[int] = []
    for k, part in enumerate(parts):
        if k % 2:
            tokens += model.tokenize(messages[int(part)]["content"], False, parse_special=False)
        elif part:
            tokens += model.tokenize(part, add_special=False, parse_special=True)
    return tokens


def render_folded(
    template: ChatTemplate,
    sent: list[dict[str, str]],
    slot: str,
    spells_special: Callable[[str], bool],
) -> tuple[list[dict[str, str]], str]:
    """The messages, folded as little as the template needs (input/turns.py), and their
    text, each message that spells a special token rendered as `slot` + its index."""
    error: ChatTemplateError | None = None
    for fold in FOLDS:
        messages = fold(sent)
        risky = {i for i, m in enumerate(messages) if spells_special(m["content"])}
        slotted = [
            {**m, "content": f"{slot}{i}\x00"} if i in risky else m for i, m in enumerate(messages)
        ]
        try:
            return messages, template.render(slotted, add_generation_prompt=True)
        except TemplateRejected as exc:
            error = error or exc  # the template's words about the messages as sent
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), param="messages", code="chat_template_error") from None
    assert error is not None
    raise APIError(400, str(error), param="messages", code="chat_template_error")


def chat_params(
    body: ChatRequest, model: Model, prompt_len: int, n_ctx: int, stops: tuple[str, ...] = ()
) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise ParamError("top_logprobs", "top_logprobs needs logprobs: true")
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= 20:
        raise ParamError(
            "top_logprobs", f"top_logprobs must be in [0, 20], got {body.top_logprobs}"
        )
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    params = request_params(body, model, n_ctx, max_tokens=max_tokens)
    if max_tokens is None:  # what fits
        params = with_default_length(params, body, n_ctx, prompt_len)
    # Chat's logprobs is a switch; the engine's is the number of alternatives (or None).
    k = (body.top_logprobs or 0) if body.logprobs else None
    # The template's end-of-turn text, for a model that does not know it as a token.
    extra = tuple(s for s in stops if s not in params.stop)[: MAX_STOPS - len(params.stop)]
    return dataclasses.replace(params, logprobs=k, stop=params.stop + extra)

"""Chat templates rendered the way Hugging Face's `apply_chat_template` renders them.

Templates come from model files and users, so they run in Jinja2's immutable sandbox:
no attribute access to Python internals, no mutation of the messages passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, rejects the messages, or fails while rendering."""


class _Rejected(jinja2.TemplateError):
    """What a template's `raise_exception(...)` raises: the template's own message."""


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
            raise ChatTemplateError(f"the chat template rejected the messages: {exc}") from None
        except Exception as exc:  # a template is code: any failure is the template's
            raise ChatTemplateError(
                f"the chat template failed: {type(exc).__name__}: {exc}"
            ) from None

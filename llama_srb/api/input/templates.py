"""Which chat template /v1/chat/completions renders with, chosen once when the model loads.

In order: --chat-template FILE; the model's own (`tokenizer.chat_template` in its GGUF);
for a Gemma 3 model without one (the bundled Gemma 3 270M is a base model), Gemma 3's own
template, shipped in `llama_srb/templates/`; for any other model, ChatML, as llama.cpp's
server falls back to. The choice is logged and reported by /props.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from llama_srb.api.errors import APIError
from llama_srb.api.input.chat_template import ChatTemplate, ChatTemplateError
from llama_srb.native import Model

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
    bos, eos = _special(model, model.bos), _special(model, model.eos)
    try:
        compiled = ChatTemplate(source, bos, eos)
    except ChatTemplateError as exc:
        log.error("chat template from %s: %s", origin, exc)
        return ServedTemplate(source, origin, stops, error=str(exc))
    log.info("chat template: %s", origin)
    return ServedTemplate(source, origin, stops, compiled)


def _special(model: Model, token: int) -> str:
    # -1: the model has no such token
    return model.special_piece(token).decode("utf-8", errors="replace") if token >= 0 else ""

"""Other servers' names for our request fields, and their value formats: the one place that
maps them.

SillyTavern, Mikupad and Loom were written against text-generation-webui, TabbyAPI,
Aphrodite, vLLM, KoboldCpp and llama.cpp's server, and send those servers' names
(`repetition_penalty`, `max_new_tokens`, `mirostat_mode`, ...), often several names for one
setting in the same body. Each request model maps them onto its canonical fields before
validation, so an alias is validated exactly like the field it stands for. When a request
carries both an alias and its canonical name, the canonical one wins; among aliases, the
first listed wins. A null counts as absent.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llama_srb.sampling.params import ParamError, SamplingParams

log = logging.getLogger(__name__)

Aliases = Mapping[str, tuple[str, ...]]

# canonical field → the names other servers' clients send for it, in the order they count
SAMPLING_ALIASES: Aliases = {
    "repeat_penalty": ("repetition_penalty", "rep_pen"),  # ooba, Tabby, Aphrodite, Kobold
    "repeat_last_n": ("repetition_penalty_range", "rep_pen_range"),
    "typical_p": ("typical",),  # KoboldCpp
    "mirostat": ("mirostat_mode",),  # ooba, Tabby
    "top_n_sigma": ("nsigma",),  # Aphrodite, KoboldCpp
    "ignore_eos": ("ban_eos_token",),  # ooba, Tabby
    "grammar": ("grammar_string",),  # ooba, Tabby
    "guided_regex": ("regex",),  # SGLang
    "seed": ("sampler_seed",),  # KoboldCpp
    "stop": ("stopping_strings",),  # ooba
    "min_tokens": ("min_length",),  # ooba
}

# /v1/completions: OpenAI's max_tokens and logprobs are canonical.
COMPLETION_ALIASES: Aliases = {
    **SAMPLING_ALIASES,
    "max_tokens": ("max_new_tokens", "n_predict", "num_predict", "max_completion_tokens"),
    "logprobs": ("n_probs",),
}

# /v1/chat/completions: max_tokens and max_completion_tokens are both OpenAI's own.
CHAT_ALIASES: Aliases = {
    **SAMPLING_ALIASES,
    "max_tokens": ("max_new_tokens", "n_predict", "num_predict"),
}

# llama.cpp's /completion: n_predict and n_probs are canonical, and the others count in
# llama-server's order (n_predict, then max_completion_tokens, then max_tokens).
NATIVE_ALIASES: Aliases = {
    **SAMPLING_ALIASES,
    "n_predict": ("max_completion_tokens", "max_tokens", "max_new_tokens", "num_predict"),
    "n_probs": ("logprobs",),
    "n": ("n_cmpl",),
}


def canonical(body: dict[str, Any], aliases: Aliases) -> dict[str, Any]:
    """`body` with each alias's value moved to its canonical name (a new dict)."""
    out = dict(body)
    for name, others in aliases.items():
        given = [a for a in others if out.get(a) is not None]
        for alias in others:
            out.pop(alias, None)
        if out.get(name) is None and given:
            out[name] = body[given[0]]
    return out


# Values other servers read as "off" or "none" where ours has its own default:
# vLLM and Aphrodite turn top-k off with -1 (SillyTavern sends -1 for them whenever its
# Top K is 0, as in every preset it ships); llama.cpp, KoboldCpp and text-generation-webui
# read seed -1 as "pick one at random" (llama.cpp's LLAMA_DEFAULT_SEED).
OFF_SENTINELS: Mapping[str, tuple[object, object]] = {
    "top_k": (-1, 0),
    "seed": (-1, None),
}


def off_sentinel(field: str | None, value: object) -> object:
    """`value`, or what it means here when it is another server's "off" for `field`."""
    sentinel, meaning = OFF_SENTINELS.get(field or "", (None, None))
    is_it = type(value) is int and value == sentinel
    return meaning if is_it else value


def sequence_breakers(value: object) -> object:
    """DRY's sequence breakers: a list of strings, or (text-generation-webui, TabbyAPI,
    Aphrodite) that list JSON-encoded in a string, with or without its brackets
    (`'["\\n", ":"]'` or `'"\\n", ":"'`). Anything else is left for validation to refuse."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        parsed = json.loads(text if text.startswith("[") else f"[{text}]")
    except ValueError:
        raise ValueError(
            "dry_sequence_breakers must be a list of strings, or one JSON-encoded in a string"
        ) from None
    if not isinstance(parsed, list) or not all(isinstance(s, str) for s in parsed):
        raise ValueError("dry_sequence_breakers must encode a list of strings")
    return parsed


# llama.cpp's sampler names (common/sampling.cpp, common_sampler_types_from_names): the
# canonical ones, kebab-case and without the underscore, plus three old aliases; case does
# not matter. Its letters (common_sampler_types_from_chars) below.
_SAMPLER_NAMES = (
    "dry",
    "top_k",
    "top_p",
    "top_n_sigma",
    "typ_p",
    "min_p",
    "temperature",
    "xtc",
    "infill",
    "penalties",
    "adaptive_p",
)
_SAMPLER_CHARS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}
SAMPLER_NAMES: Mapping[str, str] = {
    **{n.replace("_", ""): n for n in _SAMPLER_NAMES},
    **{n.replace("_", "-"): n for n in _SAMPLER_NAMES},
    **{n: n for n in _SAMPLER_NAMES},
    "nucleus": "top_p",
    "temp": "temperature",
    "typ": "typ_p",
}
MAX_SAMPLERS = 64  # a list may repeat names; llama.cpp would apply each repeat again
MAX_LOGGED_NAME = 40  # a client's name, as the warning shows it


def sampler_names(samplers: str | Sequence[str]) -> list[str]:
    """`samplers` (a list of names, or llama.cpp's one-letter string such as "kpmxt") as
    canonical names. A name or letter llama.cpp does not know is skipped with a warning, as
    llama-server does: SillyTavern's presets list `tfs_z` and `typical_p` (names llama.cpp
    never had; `typ_p` is its typical sampler) beside the ones it knows."""
    if len(samplers) > MAX_SAMPLERS:
        raise ParamError("samplers", f"at most {MAX_SAMPLERS} samplers, got {len(samplers)}")
    if isinstance(samplers, str):
        known, unknown = _known([(c, _SAMPLER_CHARS.get(c)) for c in samplers])
        if unknown:
            log.warning("samplers: skipping unknown sampler letters %s", unknown)
        return known
    known, unknown = _known([(name, SAMPLER_NAMES.get(name.lower())) for name in samplers])
    if unknown:
        log.warning(
            "samplers: skipping unknown sampler names %s (known: %s)",
            unknown,
            ", ".join(_SAMPLER_NAMES),
        )
    return known


def _known(found: list[tuple[str, str | None]]) -> tuple[list[str], list[str]]:
    """The canonical names found, and (cut short for the log) the names that were not."""
    unknown = [name[:MAX_LOGGED_NAME] for name, canonical in found if canonical is None]
    return [c for _, c in found if c is not None], unknown


# What "this sampler is not in the list" means: the setting that turns it off.
_OFF: Mapping[str, dict[str, Any]] = {
    "penalties": {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0},
    "dry": {"dry_multiplier": 0.0},
    "top_n_sigma": {"top_n_sigma": -1.0},
    "top_k": {"top_k": 0},
    "typ_p": {"typical_p": 1.0},
    "top_p": {"top_p": 1.0},
    "min_p": {"min_p": 0.0},
    "xtc": {"xtc_probability": 0.0},
    "temperature": {"temperature": 1.0, "dynatemp_range": 0.0},
}


def only_samplers(params: SamplingParams, names: Sequence[str]) -> SamplingParams:
    """`params` with every sampler that `names` leaves out turned off, as llama-server
    does with its `samplers` list (whose order SamplingParams.sampler_order keeps).
    Mirostat ignores the list, as there.
    Without "temperature", sampling is from the unscaled distribution (temperature 1)."""
    if params.mirostat:
        return params
    off: dict[str, Any] = {}
    for sampler, settings in _OFF.items():
        if sampler not in names:
            off.update(settings)
    return dataclasses.replace(params, **off) if off else params

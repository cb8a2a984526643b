"""KoboldCpp's API (the KoboldAI United API it serves, and its /api/extra routes), with its
field names and defaults, as KoboldCpp 1.76's koboldcpp.py reads them (`generate`,
`transform_genparams`) and KoboldAI Lite (its klite.embd) sends them.

Shared fields keep their canonical names (SamplingFields), KoboldCpp's being aliases
(dialects.py): `rep_pen`, `rep_pen_range`, `typical`, `sampler_seed`, `stop_sequence`,
`use_default_badwordsids`, `banned_tokens`. What llama.cpp has no sampler for (`top_a`,
`tfs`, `rep_pen_slope`, `smoothing_factor`) is checked and ignored.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llama_srb.api.schemas import dialects
from llama_srb.api.schemas.sampling import SamplingFields

KOBOLD_ALIASES: dialects.Aliases = {
    **dialects.SAMPLING_ALIASES,
    "stop": ("stop_sequence", "stopping_strings"),
    "ignore_eos": ("ban_eos_token", "use_default_badwordsids"),  # as transform_genparams
    "banned_strings": ("banned_tokens",),
}

# KoboldCpp's defaults for what a request leaves out (koboldcpp.py `generate`); unset
# SamplingParams fields not listed here keep llama.cpp's.
KOBOLD_DEFAULTS = {
    "temperature": 0.7,
    "top_k": 100,
    "top_p": 0.92,
    "min_p": 0.0,
    "repeat_penalty": 1.0,
    "repeat_last_n": 320,
    "dry_penalty_last_n": 320,
    "xtc_threshold": 0.2,
}
DEFAULT_MAX_LENGTH = 180
# KoboldCpp's sampler ids (expose.h, `samplers`): the order its sampler_order lists.
SAMPLER_IDS = {
    0: ("top_k",),
    1: (),  # top-a: llama.cpp has none
    2: ("top_p", "min_p"),  # KoboldCpp applies min-p with top-p
    3: (),  # tail-free: llama.cpp has none
    4: ("typ_p",),
    5: ("temperature",),
    6: ("penalties",),
}
MAX_SAMPLER_ORDER = 7  # KoboldCpp's sampler_order_max
MAX_GENKEY_CHARS = 128
MAX_TOKEN_BANS = 4096  # as logit_bias entries


class KoboldGenerateRequest(SamplingFields):
    """POST /api/v1/generate and /api/extra/generate/stream."""

    ALIASES: ClassVar[dialects.Aliases] = KOBOLD_ALIASES

    prompt: str = Field("", description="the text to continue")
    memory: str = Field(
        "",
        description="text put before the prompt and always kept: when the two do not fit,"
        " the prompt's beginning is cut",
    )
    max_length: int = Field(DEFAULT_MAX_LENGTH, ge=1, description="tokens to generate per result")
    max_context_length: int | None = Field(
        None,
        ge=1,
        description="the context the prompt and the result must fit in (default and at"
        " most: the server's); a longer prompt loses its beginning",
    )
    sampler_order: list[int] | None = Field(
        None,
        max_length=MAX_SAMPLER_ORDER,
        description="KoboldCpp's sampler ids in the order they run (0 top-k, 1 top-a,"
        " 2 top-p and min-p, 3 tail-free, 4 typical, 5 temperature, 6 repetition penalty);"
        " the ones left out do not run",
    )
    trim_stop: bool = Field(False, description="leave the stop sequence out of the text")
    genkey: str = Field(
        "",
        max_length=MAX_GENKEY_CHARS,
        description="a key of the client's choosing: /api/extra/generate/check and"
        " /api/extra/abort find this generation by it",
    )
    logprobs: bool | int = Field(
        False, description="each result's tokens with their 5 most likely alternatives"
    )
    custom_token_bans: str = Field("", description="token ids never generated, comma-separated")
    images: list[str] = Field(default_factory=list, max_length=0, description="not served")
    # KoboldCpp's fields with no sampler in llama.cpp: checked, then ignored.
    top_a: float = Field(0.0, ge=0)
    tfs: float = Field(1.0, ge=0, le=1)
    rep_pen_slope: float = Field(1.0, ge=0)
    smoothing_factor: float = Field(0.0, ge=0)
    grammar_retain_state: bool = False
    render_special: bool = False
    bypass_eos: bool = False
    quiet: bool = False

    @field_validator("sampler_order")
    @classmethod
    def _known_ids(cls, order: list[int] | None) -> list[int] | None:
        unknown = sorted({i for i in order or () if i not in SAMPLER_IDS})
        if unknown:
            raise ValueError(f"unknown sampler ids {unknown}: KoboldCpp's are 0 to 6")
        return order

    @field_validator("custom_token_bans")
    @classmethod
    def _token_ids(cls, bans: str) -> str:
        ids = [part.strip() for part in bans.split(",") if part.strip()]
        if len(ids) > MAX_TOKEN_BANS:
            raise ValueError(f"at most {MAX_TOKEN_BANS} custom_token_bans")
        if not all(part.isdigit() for part in ids):
            raise ValueError("custom_token_bans are token ids, comma-separated")
        return bans

    def token_bans(self) -> dict[str, float | bool]:
        """`custom_token_bans` ("12,345") as logit biases that ban those tokens."""
        return {part.strip(): -100.0 for part in self.custom_token_bans.split(",") if part.strip()}


class GenkeyRequest(BaseModel):
    """POST /api/extra/generate/check and /api/extra/abort (a body is optional)."""

    model_config = ConfigDict(extra="ignore")

    genkey: str = Field("", max_length=MAX_GENKEY_CHARS)


class TokenCountRequest(BaseModel):
    """POST /api/extra/tokencount."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = ""
    special: bool = Field(True, description="add the model's BOS token, if it wants one")

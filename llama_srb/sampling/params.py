"""Per-request sampling parameters: one frozen, validated object per request.

Defaults follow llama.cpp's server (what users of local models expect), not OpenAI's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

DEFAULT_DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

# Bounds on what one request may make a branch carry: every branch checks its stop
# strings on each token, and llama.cpp's DRY sampler keeps its breakers per branch.
MAX_STOPS = 64
MAX_STOP_CHARS = 512
MAX_DRY_BREAKERS = 16  # DRY's setup scans the vocabulary once per breaker
MAX_DRY_BREAKER_CHARS = 64
INT32_MAX = 2**31 - 1  # the C type of every integer parameter but the seed


class ParamError(ValueError):
    """A request parameter is out of range; `param` names it for the API error."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None
    logprobs: int | None = None  # top alternatives per token; None: not computed at all

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ParamError(f.name, f"{f.name} must be a finite number, got {value}")
            if isinstance(value, int) and f.name != "seed" and abs(value) > INT32_MAX:
                # ctypes would silently truncate it on the way into C
                raise ParamError(f.name, f"{f.name} must be at most {INT32_MAX}, got {value}")
        _check_range("max_tokens", self.max_tokens, 0, None)
        _check_range("min_tokens", self.min_tokens, 0, None)
        _check_range("temperature", self.temperature, 0.0, 100.0)
        _check_range("top_k", self.top_k, 0, None)
        _check_range("top_p", self.top_p, 0.0, 1.0)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("typical_p", self.typical_p, 0.0, 1.0)
        _check_range("repeat_penalty", self.repeat_penalty, 0.0, 10.0)
        _check_range("repeat_last_n", self.repeat_last_n, -1, None)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("dry_multiplier", self.dry_multiplier, 0.0, 100.0)
        _check_range("dry_base", self.dry_base, 1.0, 100.0)
        _check_range("dry_allowed_length", self.dry_allowed_length, 0, None)
        _check_range("dry_penalty_last_n", self.dry_penalty_last_n, -1, None)
        _check_range("xtc_probability", self.xtc_probability, 0.0, 1.0)
        _check_range("xtc_threshold", self.xtc_threshold, 0.0, 1.0)
        _check_range("mirostat", self.mirostat, 0, 2)
        _check_range("mirostat_tau", self.mirostat_tau, 0.0, 100.0)
        _check_range("mirostat_eta", self.mirostat_eta, 0.0, 1.0)
        _check_range("dynatemp_range", self.dynatemp_range, 0.0, 100.0)
        _check_range("dynatemp_exponent", self.dynatemp_exponent, 0.0, 100.0)
        if self.seed is not None:
            _check_range("seed", self.seed, -(2**63), 2**64 - 1)
        if self.logprobs is not None:
            _check_range("logprobs", self.logprobs, 0, 20)
        _check_strings("stop", self.stop, MAX_STOPS, MAX_STOP_CHARS)
        _check_strings(
            "dry_sequence_breakers",
            self.dry_sequence_breakers,
            MAX_DRY_BREAKERS,
            MAX_DRY_BREAKER_CHARS,
        )

    def check_model_limits(self, n_vocab: int, n_ctx: int) -> None:
        """Bounds that depend on the model and context: a top_k beyond the vocabulary or
        a penalty window beyond the context means nothing, and costs memory in C."""
        _check_range("top_k", self.top_k, 0, n_vocab)
        _check_range("repeat_last_n", self.repeat_last_n, -1, n_ctx)
        _check_range("dry_penalty_last_n", self.dry_penalty_last_n, -1, n_ctx)
        _check_range("dry_allowed_length", self.dry_allowed_length, 0, n_ctx)
        _check_range("min_tokens", self.min_tokens, 0, n_ctx)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _check_range(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ParamError(name, f"{name} must be {bounds}, got {value}")


def _check_strings(name: str, values: tuple[str, ...], most: int, longest: int) -> None:
    if len(values) > most:
        raise ParamError(name, f"at most {most} {name} strings, got {len(values)}")
    for value in values:
        if not value:
            raise ParamError(name, f"{name} strings must not be empty")
        if len(value) > longest:
            raise ParamError(name, f"{name} strings must be at most {longest} characters")

"""Per-request sampling parameters: one frozen, validated object per request.

Defaults follow llama.cpp's server (what users of local models expect), not OpenAI's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from llama_srb.sampling.constraint import Constraint
from llama_srb.sampling.errors import ParamError
from llama_srb.sampling.patterns import MAX_BANNED_REGEX, MAX_REGEX_CHARS, check_patterns

__all__ = ["ParamError", "SamplingParams"]

DEFAULT_DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

# Bounds on what one request may make a branch carry: every branch checks its stop
# strings on each token, and llama.cpp's DRY sampler keeps its breakers per branch.
MAX_STOPS = 64
MAX_STOP_CHARS = 512
MAX_DRY_BREAKERS = 16  # DRY's setup scans the vocabulary once per breaker
MAX_DRY_BREAKER_CHARS = 64
INT32_MAX = 2**31 - 1  # the C type of every integer parameter but the seed
# Banned phrases are looked for in every branch's held-back text on each token.
MAX_BANNED_STRINGS = 128
MAX_BANNED_CHARS = 256
# A temperature and a repeat penalty divide logits (llama.cpp's, in float32): a divisor
# near 0 makes them inf, and the row's weights NaN.
SMALLEST_DIVISOR = 1e-6

# What `choices_params` may set per branch: the sampler chain's own settings. Lengths,
# stops, grammar, seed and logprobs stay request-wide (they size the KV reservation, shape
# the response, or are derived per branch already: seed + index).
BRANCH_FIELDS = frozenset(
    {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "repeat_last_n",
        "frequency_penalty",
        "presence_penalty",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "xtc_probability",
        "xtc_threshold",
        "top_n_sigma",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "dynatemp_range",
        "dynatemp_exponent",
    }
)
Overrides = tuple[tuple[str, Any], ...]  # one branch's (field, value) pairs, sorted


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
    # The request's constraint compiled by llguidance (sampling/constraint.py), shared by
    # its branches: each takes `constraint.matcher()`.
    constraint: Constraint | None = None
    logprobs: int | None = None  # top alternatives per token; None: not computed at all
    # Choosing between branches (sampling/banned.py, sampling/branch.py): phrases no branch
    # may produce, first tokens all different, and per-branch sampler overrides.
    banned_strings: tuple[str, ...] = ()
    banned_strings_case_sensitive: bool = False  # for banned_regex too
    banned_regex: tuple[str, ...] = ()  # RE2 patterns (sampling/patterns.py)
    distinct_openings: bool = False
    choices_params: tuple[Overrides, ...] = ()
    # llama.cpp's `samplers`: the chain's order by sampler name (sampling/chain.py); ()
    # is llama.cpp's default order.
    sampler_order: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.choices_params, tuple) or any(
            isinstance(entry, Mapping) for entry in self.choices_params
        ):
            object.__setattr__(self, "choices_params", parse_choices_params(self.choices_params))
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
        if 0.0 < self.temperature < SMALLEST_DIVISOR:
            raise ParamError(
                "temperature",
                f"temperature must be 0 (greedy) or at least {SMALLEST_DIVISOR:g},"
                f" got {self.temperature}",
            )
        _check_range("top_k", self.top_k, 0, None)
        _check_range("top_p", self.top_p, 0.0, 1.0)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("typical_p", self.typical_p, 0.0, 1.0)
        _check_range("repeat_penalty", self.repeat_penalty, SMALLEST_DIVISOR, 10.0)  # 1: off
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
        _check_strings("banned_strings", self.banned_strings, MAX_BANNED_STRINGS, MAX_BANNED_CHARS)
        _check_strings("banned_regex", self.banned_regex, MAX_BANNED_REGEX, MAX_REGEX_CHARS)
        if self.banned_regex:  # compiled once per list (cached), so branches re-check free
            check_patterns("banned_regex", self.banned_regex, self.banned_strings_case_sensitive)
        for i in range(len(self.choices_params)):
            self.for_branch(i)  # each entry is checked as a request's own fields are

    def for_branch(self, index: int) -> SamplingParams:
        """Branch `index`'s parameters: the request's, with its `choices_params` entry."""
        if index >= len(self.choices_params) or not self.choices_params[index]:
            return self
        try:
            return replace(self, choices_params=(), **dict(self.choices_params[index]))
        except ParamError as exc:
            raise ParamError(
                f"choices_params[{index}].{exc.param}", f"choices_params[{index}]: {exc}"
            ) from None

    def check_model_limits(self, n_vocab: int, n_ctx: int) -> None:
        """Bounds that depend on the model and context: a top_k beyond the vocabulary or
        a penalty window beyond the context means nothing, and costs memory in C."""
        _check_range("top_k", self.top_k, 0, n_vocab)
        _check_range("repeat_last_n", self.repeat_last_n, -1, n_ctx)
        _check_range("dry_penalty_last_n", self.dry_penalty_last_n, -1, n_ctx)
        _check_range("dry_allowed_length", self.dry_allowed_length, 0, n_ctx)
        _check_range("min_tokens", self.min_tokens, 0, n_ctx)
        for i, entry in enumerate(self.choices_params):
            if not entry:  # the request's own settings, checked above
                continue
            try:
                self.for_branch(i).check_model_limits(n_vocab, n_ctx)
            except ParamError as exc:
                if exc.param.startswith("choices_params"):
                    raise
                raise ParamError(
                    f"choices_params[{i}].{exc.param}", f"choices_params[{i}]: {exc}"
                ) from None

    @property
    def bans_text(self) -> bool:
        """Branches may be taken back: banned phrases or patterns."""
        return bool(self.banned_strings or self.banned_regex)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def deterministic(self) -> bool:
        """Every branch would be the same text: greedy, with no branch's own settings and
        no distinct first tokens."""
        return self.greedy and not any(self.choices_params) and not self.distinct_openings


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


_FIELD_TYPES = {f.name: f.type for f in fields(SamplingParams)}
MAX_CHOICES_PARAMS = 256  # never more than the branches a request may have


def parse_choices_params(entries: object) -> tuple[Overrides, ...]:
    """`choices_params` as the client sent it (a list of objects) → per-branch overrides,
    each value checked for its type here and for its range by `for_branch`."""
    if not isinstance(entries, list | tuple):
        raise ParamError("choices_params", "choices_params must be a list of objects")
    if len(entries) > MAX_CHOICES_PARAMS:
        raise ParamError("choices_params", f"at most {MAX_CHOICES_PARAMS} choices_params entries")
    parsed = []
    for i, entry in enumerate(entries):
        if isinstance(entry, tuple):
            entry = dict(entry)
        if not isinstance(entry, Mapping):
            raise ParamError(f"choices_params[{i}]", f"choices_params[{i}] must be an object")
        parsed.append(branch_overrides(entry, f"choices_params[{i}]."))
    return tuple(parsed)


def branch_overrides(entry: Mapping[str, object], where: str = "") -> Overrides:
    """One branch's settings as a client sent them (`where` prefixes the field's name in
    errors), each value checked for its type; its range is SamplingParams' to check."""
    pairs = []
    for key, value in entry.items():
        name = f"{where}{key}"
        if key not in BRANCH_FIELDS:
            allowed = ", ".join(sorted(BRANCH_FIELDS))
            raise ParamError(name, f"{name} cannot be set per branch; allowed: {allowed}")
        pairs.append((key, _typed(name, _FIELD_TYPES[key], value)))
    return tuple(sorted(pairs))


def _typed(name: str, kind: object, value: object) -> object:
    """A JSON value as the field's type (numbers as float or int, breakers as strings)."""
    if kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ParamError(name, f"{name} must be a number, got {value!r}")
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ParamError(name, f"{name} must be an integer, got {value!r}")
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ParamError(name, f"{name} must be a list of strings, got {value!r}")

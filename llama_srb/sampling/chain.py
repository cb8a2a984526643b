"""SamplingParams → a branch's sampler chain, as llama.cpp's pieces and a plan of who does what.

By default the order is llama.cpp's own default chain, so a setting means here what it
means there: bias → penalties → DRY → top-n-sigma → top-k → typical → top-p → min-p → XTC
→ temperature → pick (dist, mirostat, or greedy at temperature 0). `sampler_order` (from
llama.cpp's `samplers` field) reorders the samplers between the bias and the pick, as
llama-server does.

A chain runs in three parts (`ChainPlan`); which sampler takes which path is the table in
docs/sampling.md:
- the head: the bias (numpy) and the penalties and DRY before the first cut, llama.cpp's
  own, applied to the few tokens they can change (the branch's history and the biased
  tokens), not to the whole vocabulary;
- the cut: the chain's first filter over the whole row, found by sampling/cut.py (top-k,
  min-p, top-p, the greedy pick, a draw from every token); or, for a first sampler that
  needs every candidate (typical, top-n-sigma, XTC, mirostat, dynamic temperature), none:
  then llama.cpp's chain runs from it over the whole vocabulary, as before;
- the finish: llama.cpp's own samplers after the cut, and the pick, over its survivors.
A grammar's mask (llguidance, sampling/masks.py) is applied to the row before all of it.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp as C

from llama_srb.native import Model, SamplerChain
from llama_srb.sampling.params import SamplingParams

DEFAULT_ORDER = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
SEEDED = frozenset({"xtc", "temperature"})  # built per branch: they hold its seed
# What greedy and mirostat keep before their pick: the samplers that shape the logits
# without cutting the candidates (mirostat does its own cutting, greedy needs none).
_BEFORE_ANY_PICK = frozenset({"penalties", "dry"})
REMEMBERING = frozenset({"penalties", "dry"})  # they keep the tokens a branch accepted


class CutKind(enum.Enum):
    GREEDY = "greedy"  # the most likely token: no filter, greedy pick
    DRAW = "draw"  # no filter, a draw from every token (at the chain's temperature)
    TOP_K = "top_k"
    MIN_P = "min_p"
    TOP_P = "top_p"
    WHOLE = "whole"  # the first sampler needs every candidate: llama.cpp over the row


CUTS = frozenset({"top_k", "min_p", "top_p"})  # first filters found over the row (cut.py)


@dataclass(frozen=True)
class ChainPlan:
    """The chain between the bias and the pick, split where its first cut is.

    `head`: the penalties and DRY before it. `cut`: what finds it over the whole row;
    `scale` is the product of 1/temperature of the plain temperatures before it, and
    `cap` a prefix cut (min-p, top-k) right after a top-p, decided together with it.
    `finish`: llama.cpp's samplers after the cut (all of them for WHOLE), then the pick."""

    head: tuple[str, ...]
    cut: CutKind
    finish: tuple[str, ...] = ()
    scale: float = 1.0
    cap: str | None = None


def chain_order(p: SamplingParams) -> list[str]:
    """The samplers of p's chain between the bias and the pick, in order: those its
    settings turn on, in `sampler_order` (repeats applied again, as llama.cpp does) or
    the default order."""
    order = p.sampler_order or DEFAULT_ORDER
    keep = _BEFORE_ANY_PICK if p.greedy or p.mirostat else None
    return [n for n in order if _is_on(n, p) and (keep is None or n in keep)]


def plan_chain(p: SamplingParams) -> ChainPlan:
    names = chain_order(p)
    split = next((i for i, n in enumerate(names) if n not in REMEMBERING), len(names))
    head, rest = tuple(names[:split]), tuple(names[split:])
    if p.greedy:
        return ChainPlan(head, CutKind.GREEDY)
    if p.mirostat:
        return ChainPlan(head, CutKind.WHOLE, rest)
    scale = 1.0
    for i, name in enumerate(rest):
        if name == "temperature" and p.dynatemp_range <= 0:
            scale /= p.temperature  # a plain temperature before the cut scales the row
        elif name in CUTS:
            following = rest[i + 1] if i + 1 < len(rest) else None
            cap = following if name == "top_p" and following in ("min_p", "top_k") else None
            return ChainPlan(head, CutKind(name), rest[i + 1 :], scale, cap)
        else:  # it needs every candidate: llama.cpp's chain from the start of the rest
            return ChainPlan(head, CutKind.WHOLE, rest)
    return ChainPlan(head, CutKind.DRAW, (), scale)  # only plain temperatures: a draw


def history_window(model: Model, p: SamplingParams, name: str) -> int:
    """How many of a branch's latest tokens a remembering sampler keeps."""
    last_n = p.repeat_last_n if name == "penalties" else p.dry_penalty_last_n
    return model.n_ctx_train if last_n == -1 else last_n


def _is_on(name: str, p: SamplingParams) -> bool:
    """Whether the sampler changes anything with p's settings (llama.cpp's own tests: a
    penalty window of 0 turns penalties or DRY off, as their values at 1 or 0 do)."""
    if name == "penalties":
        changes = p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
        return changes and p.repeat_last_n != 0
    return {
        "dry": p.dry_multiplier > 0.0 and p.dry_penalty_last_n != 0,
        "top_n_sigma": p.top_n_sigma > 0.0,
        "top_k": p.top_k > 0,
        "typ_p": p.typical_p < 1.0,
        "top_p": p.top_p < 1.0,
        "min_p": p.min_p > 0.0,
        "xtc": p.xtc_probability > 0.0,
        "temperature": True,
    }.get(name, False)  # infill, adaptive_p: not in this build's chain


def build(
    model: Model,
    p: SamplingParams,
    names: Sequence[str],
    seeds: list[int],
    pick: bool,
    bias: bool = False,
) -> list[SamplerChain]:
    """One llama.cpp chain of `names` per seed: after the logit bias when `bias`, and
    with the pick when `pick`. The samplers up to the first seeded one are built once and
    cloned for every branch: DRY's setup scans the vocabulary for every sequence breaker
    (~50 ms each here), and a clone copies the result."""
    split = next((i for i, name in enumerate(names) if name in SEEDED), len(names))
    first = bias_sampler(model, p) if bias else []
    shared = SamplerChain.of(first + [make(model, p, n, 0) for n in names[:split]])
    chains: list[SamplerChain] = []
    try:
        for seed in seeds:
            chain = shared.clone()
            chains.append(chain)  # owned by the list from here: closed if a later step fails
            seed &= 0xFFFFFFFF
            chain.extend([make(model, p, n, seed) for n in names[split:]])
            if pick:
                chain.extend(_pick(model, p, seed))
    except BaseException:
        for built in chains:
            built.close()
        raise
    finally:
        shared.close()
    return chains


def bias_sampler(model: Model, p: SamplingParams) -> list[C.llama_sampler_p]:
    if not p.logit_bias:
        return []
    pairs = [C.llama_logit_bias(token, bias) for token, bias in p.logit_bias]
    array = (C.llama_logit_bias * len(pairs))(*pairs)
    return [C.llama_sampler_init_logit_bias(model.n_vocab, len(pairs), array)]


def make(model: Model, p: SamplingParams, name: str, seed: int) -> C.llama_sampler_p:
    """One sampler of the chain, by its llama.cpp name."""
    if name == "penalties":
        return C.llama_sampler_init_penalties(  # this build's API takes n_vocab first
            model.n_vocab,
            history_window(model, p, name),
            p.repeat_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        )
    if name == "dry":
        breakers = [b.encode() for b in p.dry_sequence_breakers]
        breaker_array = (ctypes.c_char_p * len(breakers))(*breakers)
        # This build's DRY takes no context size, so -1 ("the whole context") is resolved
        # here, to the training context as llama.cpp's own server does.
        return C.llama_sampler_init_dry(
            model.vocab,
            p.dry_multiplier,
            p.dry_base,
            p.dry_allowed_length,
            history_window(model, p, name),
            breaker_array,
            len(breakers),
        )
    if name == "top_n_sigma":
        return C.llama_sampler_init_top_n_sigma(p.top_n_sigma)
    if name == "top_k":
        return C.llama_sampler_init_top_k(p.top_k)
    if name == "typ_p":
        return C.llama_sampler_init_typical(p.typical_p, 1)
    if name == "top_p":
        return C.llama_sampler_init_top_p(p.top_p, 1)
    if name == "min_p":
        return C.llama_sampler_init_min_p(p.min_p, 1)
    if name == "xtc":
        return C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1, seed)
    assert name == "temperature", name
    return C.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent)


def _pick(model: Model, p: SamplingParams, seed: int) -> list[C.llama_sampler_p]:
    """The end of the chain: greedy, mirostat (after its temperature) or a seeded draw."""
    if p.greedy:
        return [C.llama_sampler_init_greedy()]
    if p.mirostat == 1:
        mirostat = C.llama_sampler_init_mirostat(
            model.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100
        )
        return [C.llama_sampler_init_temp(p.temperature), mirostat]
    if p.mirostat == 2:
        mirostat = C.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta)
        return [C.llama_sampler_init_temp(p.temperature), mirostat]
    return [C.llama_sampler_init_dist(seed)]

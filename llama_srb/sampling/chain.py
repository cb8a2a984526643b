"""SamplingParams → a llama.cpp sampler chain, built in C, one per sequence.

By default the order is llama.cpp's own default chain, so a setting means here what it
means there: bias → penalties → DRY → top-n-sigma → top-k → typical → top-p → min-p → XTC
→ temperature → pick (dist, mirostat, or greedy at temperature 0). `sampler_order` (from
llama.cpp's `samplers` field) reorders the samplers between the bias and the pick, as
llama-server does. A grammar, when given, wraps the chain (sampling/grammar.py).
"""

from __future__ import annotations

import ctypes

import llama_cpp as C

from llama_srb.native import Model, SamplerChain
from llama_srb.sampling.grammar import ConstrainedChain, clone_grammar, parse_grammar
from llama_srb.sampling.params import SamplingParams


def build_chains(
    model: Model, params: SamplingParams, seeds: list[int]
) -> list[SamplerChain | ConstrainedChain]:
    """One chain per branch; `seeds[i]` is already `base seed + choice index`.

    The chain up to its first seeded sampler (bias, penalties, DRY, the filters, in the
    default order) is built once and cloned for each branch, which then gets the rest:
    DRY's setup scans the vocabulary for every sequence breaker (~50 ms each here), and
    cloning copies the result. A grammar is parsed once and cloned the same way. Raises ParamError when the
    grammar does not parse.
    """
    names = chain_order(params)
    split = next((i for i, name in enumerate(names) if name in SEEDED), len(names))
    shared = SamplerChain.of(
        _bias(model, params) + [_make(model, params, n, 0) for n in names[:split]]
    )
    grammar = None
    chains: list[SamplerChain | ConstrainedChain] = []
    try:
        grammar = parse_grammar(model, params.grammar) if params.grammar is not None else None
        for seed in seeds:
            chain = shared.clone()
            chains.append(chain)  # owned by the list from here: closed if a later step fails
            seed &= 0xFFFFFFFF
            chain.extend([_make(model, params, n, seed) for n in names[split:]])
            chain.extend(_pick(model, params, seed))
            if grammar is not None:
                chains[-1] = ConstrainedChain(chain, clone_grammar(grammar), model.n_vocab)
    except BaseException:
        for built in chains:
            built.close()
        raise
    finally:
        shared.close()
        if grammar is not None:
            C.llama_sampler_free(grammar)
    return chains


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


def chain_order(p: SamplingParams) -> list[str]:
    """The samplers of p's chain between the bias and the pick, in order: those its
    settings turn on, in `sampler_order` (repeats applied again, as llama.cpp does) or
    the default order."""
    order = p.sampler_order or DEFAULT_ORDER
    keep = _BEFORE_ANY_PICK if p.greedy or p.mirostat else None
    return [n for n in order if _is_on(n, p) and (keep is None or n in keep)]


def history_samplers(model: Model, p: SamplingParams) -> tuple[tuple[int, int], ...]:
    """The samplers of a chain that remember the tokens it accepted (penalties, DRY), as
    (position in the chain, how many of the latest tokens they remember): what a rewind
    restores (sampling/branch.py)."""
    first = 1 if p.logit_bias else 0
    out = []
    for position, name in enumerate(chain_order(p), start=first):
        if name == "penalties":
            out.append((position, model.n_ctx_train if p.repeat_last_n == -1 else p.repeat_last_n))
        elif name == "dry":
            last_n = model.n_ctx_train if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n
            out.append((position, last_n))
    return tuple(out)


def _is_on(name: str, p: SamplingParams) -> bool:
    if name == "penalties":
        return p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    return {
        "dry": p.dry_multiplier > 0.0,
        "top_n_sigma": p.top_n_sigma > 0.0,
        "top_k": p.top_k > 0,
        "typ_p": p.typical_p < 1.0,
        "top_p": p.top_p < 1.0,
        "min_p": p.min_p > 0.0,
        "xtc": p.xtc_probability > 0.0,
        "temperature": True,
    }.get(name, False)  # infill, adaptive_p: not in this build's chain


def _bias(model: Model, p: SamplingParams) -> list[C.llama_sampler_p]:
    if not p.logit_bias:
        return []
    pairs = [C.llama_logit_bias(token, bias) for token, bias in p.logit_bias]
    array = (C.llama_logit_bias * len(pairs))(*pairs)
    return [C.llama_sampler_init_logit_bias(model.n_vocab, len(pairs), array)]


def _make(model: Model, p: SamplingParams, name: str, seed: int) -> C.llama_sampler_p:
    """One sampler of the chain, by its llama.cpp name."""
    if name == "penalties":
        last_n = model.n_ctx_train if p.repeat_last_n == -1 else p.repeat_last_n
        return C.llama_sampler_init_penalties(  # this build's API takes n_vocab first
            model.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
        )
    if name == "dry":
        breakers = [b.encode() for b in p.dry_sequence_breakers]
        breaker_array = (ctypes.c_char_p * len(breakers))(*breakers)
        # This build's DRY takes no context size, so -1 ("the whole context") is resolved
        # here, to the training context as llama.cpp's own server does.
        last_n = model.n_ctx_train if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n
        return C.llama_sampler_init_dry(
            model.vocab,
            p.dry_multiplier,
            p.dry_base,
            p.dry_allowed_length,
            last_n,
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

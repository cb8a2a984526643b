"""SamplingParams → a llama.cpp sampler chain, built in C, one per sequence.

The order follows llama.cpp's own default chain, so a setting means here what it means
there: bias → penalties → DRY → top-n-sigma → top-k → typical → top-p → min-p → XTC →
temperature → pick (dist, mirostat, or greedy at temperature 0). A grammar, when given,
wraps the chain (sampling/grammar.py).
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

    What does not depend on the seed (bias, penalties, DRY, the filters) is built once and
    cloned for each branch, which then gets its seeded samplers: DRY's setup scans the
    vocabulary for every sequence breaker (~50 ms each here), and cloning copies the
    result. A grammar is parsed once and cloned the same way. Raises ParamError when the
    grammar does not parse.
    """
    shared = SamplerChain.of(_unseeded_samplers(model, params))
    grammar = None
    chains: list[SamplerChain | ConstrainedChain] = []
    try:
        grammar = parse_grammar(model, params.grammar) if params.grammar is not None else None
        for seed in seeds:
            chain = shared.clone()
            chains.append(chain)  # owned by the list from here: closed if a later step fails
            chain.extend(_seeded_samplers(model, params, seed & 0xFFFFFFFF))
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


def history_samplers(model: Model, p: SamplingParams) -> tuple[tuple[int, int], ...]:
    """The samplers of a chain that remember the tokens it accepted (penalties, DRY), as
    (position in the chain, how many of the latest tokens they remember): what a rewind
    restores (sampling/branch.py). Positions follow `_unseeded_samplers`'s order."""
    out, position = [], 1 if p.logit_bias else 0
    if p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        out.append((position, model.n_ctx_train if p.repeat_last_n == -1 else p.repeat_last_n))
        position += 1
    if p.dry_multiplier > 0.0:
        last_n = model.n_ctx_train if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n
        out.append((position, last_n))
    return tuple(out)


def _unseeded_samplers(model: Model, p: SamplingParams) -> list[C.llama_sampler_p]:
    """The chain up to its first seeded sampler, in llama.cpp's order."""
    out: list[C.llama_sampler_p] = []
    if p.logit_bias:
        pairs = [C.llama_logit_bias(token, bias) for token, bias in p.logit_bias]
        array = (C.llama_logit_bias * len(pairs))(*pairs)
        out.append(C.llama_sampler_init_logit_bias(model.n_vocab, len(pairs), array))
    if p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        last_n = model.n_ctx_train if p.repeat_last_n == -1 else p.repeat_last_n
        out.append(
            C.llama_sampler_init_penalties(  # this build's API takes n_vocab first
                model.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        )
    if p.dry_multiplier > 0.0:
        breakers = [b.encode() for b in p.dry_sequence_breakers]
        breaker_array = (ctypes.c_char_p * len(breakers))(*breakers)
        # This build's DRY takes no context size, so -1 ("the whole context") is resolved
        # here, to the training context as llama.cpp's own server does.
        last_n = model.n_ctx_train if p.dry_penalty_last_n == -1 else p.dry_penalty_last_n
        out.append(
            C.llama_sampler_init_dry(
                model.vocab,
                p.dry_multiplier,
                p.dry_base,
                p.dry_allowed_length,
                last_n,
                breaker_array,
                len(breakers),
            )
        )
    if p.greedy or p.mirostat:
        return out
    if p.top_n_sigma > 0.0:
        out.append(C.llama_sampler_init_top_n_sigma(p.top_n_sigma))
    if p.top_k > 0:
        out.append(C.llama_sampler_init_top_k(p.top_k))
    if p.typical_p < 1.0:
        out.append(C.llama_sampler_init_typical(p.typical_p, 1))
    if p.top_p < 1.0:
        out.append(C.llama_sampler_init_top_p(p.top_p, 1))
    if p.min_p > 0.0:
        out.append(C.llama_sampler_init_min_p(p.min_p, 1))
    return out


def _seeded_samplers(model: Model, p: SamplingParams, seed: int) -> list[C.llama_sampler_p]:
    """The rest of the chain: XTC, temperature and the pick (greedy, mirostat or dist)."""
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
    out: list[C.llama_sampler_p] = []
    if p.xtc_probability > 0.0:
        out.append(C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1, seed))
    out.append(C.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent))
    out.append(C.llama_sampler_init_dist(seed))
    return out

"""The engine's limit: the fewest steps that do single request batching in llama.cpp.

No HTTP, no detokenization, no scheduler: prompt once, `seq_cp` to n sequences, one token
per sequence per `llama_decode`, llama.cpp's own sampler chain (the server's defaults).
Same context settings as the server, so the ratio between the two is the server's overhead.
"""

from __future__ import annotations

import time

import llama_cpp as C

from llama_srb.config import Settings
from llama_srb.loader import model_options, open_context
from llama_srb.native import Batch, Model


def default_chain(seed: int) -> C.llama_sampler_p:
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    for sampler in (
        C.llama_sampler_init_top_k(40),
        C.llama_sampler_init_top_p(0.95, 1),
        C.llama_sampler_init_min_p(0.05, 1),
        C.llama_sampler_init_temp(0.8),
        C.llama_sampler_init_dist(seed),
    ):
        C.llama_sampler_chain_add(chain, sampler)
    return chain


class RawLoop:
    def __init__(self, settings: Settings) -> None:
        self.model = Model(settings.resolved_model_path(), model_options(settings))
        self.ctx = open_context(self.model, settings)  # the context the server would get
        self.batch = Batch(self.ctx.n_batch)

    def run(self, prompt: list[int], n: int, new_tokens: int) -> float:
        """Generate `new_tokens` for each of `n` branches; returns wall seconds."""
        ctx, batch = self.ctx, self.batch
        C.llama_memory_clear(ctx.memory, True)
        chains = [default_chain(1000 + i) for i in range(n)]
        started = time.perf_counter()
        for start in range(0, len(prompt), ctx.n_batch):
            batch.clear()
            chunk = prompt[start : start + ctx.n_batch]
            batch.add_span(chunk, start, 0, start + len(chunk) == len(prompt))
            ctx.decode(batch)
        for seq_id in range(1, n):
            ctx.seq_cp(0, seq_id)
        last = [batch.n_tokens - 1] * n
        pos = len(prompt)
        for _ in range(new_tokens):
            tokens = [C.llama_sampler_sample(chains[i], ctx.ptr, last[i]) for i in range(n)]
            batch.clear()
            last = [batch.add(tokens[i], pos, i, True) for i in range(n)]
            ctx.decode(batch)
            pos += 1
        elapsed = time.perf_counter() - started
        for chain in chains:
            C.llama_sampler_free(chain)
        return elapsed

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()

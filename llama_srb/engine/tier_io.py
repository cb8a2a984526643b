"""Moving KV cells between the live cache and the tiers (engine/tiers.py), on the engine
thread: a cached path's state is copied down before its cells go, and a tier entry is
loaded into a request's first sequence. Every restore is checked (bytes intact, llama.cpp
took them, the positions it holds); one that fails leaves the sequence empty, and its
request reads the prompt instead."""

from __future__ import annotations

import logging
import time

from llama_srb.engine.context import DecodeContext
from llama_srb.engine.kv import KvRestore, KvSave
from llama_srb.engine.stats import EngineStats
from llama_srb.engine.tiers import MiB, TierStore
from llama_srb.native import NativeError

log = logging.getLogger(__name__)


class TierIO:
    def __init__(self, ctx: DecodeContext, tiers: TierStore | None, stats: EngineStats) -> None:
        self.ctx = ctx
        self.tiers = tiers
        self.stats = stats

    def save(self, op: KvSave) -> None:
        """Copy a cached path's cells down. With a sliding window, a second entry ends
        where its prompt did: the sequence is cut there (the op is the last use of the
        cells beyond)."""
        if self.tiers is None:
            return
        started = time.perf_counter()
        try:
            self.tiers.put(op.tokens, self.ctx.state_get(op.dst))
            if op.prompt_end and self.tiers.sliding_window:
                self.ctx.seq_rm(op.dst, op.prompt_end, -1)
                self.tiers.put(op.tokens[: op.prompt_end], self.ctx.state_get(op.dst))
        except NativeError as exc:  # dropped instead: nothing else is lost
            log.warning("could not save a cached path of %d tokens: %s", len(op.tokens), exc)
        self.stats.tier_save_seconds += time.perf_counter() - started

    def restore(self, op: KvRestore) -> bool:
        """Load `op.entry` into the empty sequence `op.dst` and keep its first `op.p1`
        cells; False (the sequence empty) when that cannot be done exactly."""
        entry, tiers = op.entry, self.tiers
        assert entry is not None and tiers is not None
        tier = entry.tier.value
        started = time.perf_counter()
        data = tiers.load(entry)
        loaded = data is not None and self.ctx.state_set(op.dst, data)
        if loaded and self.ctx.seq_pos_max(op.dst) != len(entry) - 1:
            self.ctx.seq_rm(op.dst)
            loaded = False
        if not loaded:
            if data is not None:
                tiers.drop(entry)  # llama.cpp refused it: it would refuse it again
            self.stats.tier_restore_failures += 1
            log.warning(
                "could not restore %d cached tokens from the %s tier: reading them", op.p1, tier
            )
            return False
        self.ctx.seq_rm(op.dst, op.p1, -1)
        seconds = time.perf_counter() - started
        assert data is not None
        self.stats.tier_hits[tier] = self.stats.tier_hits.get(tier, 0) + 1
        self.stats.tier_tokens_restored[tier] = self.stats.tier_tokens_restored.get(tier, 0) + op.p1
        self.stats.tier_bytes_restored[tier] = self.stats.tier_bytes_restored.get(tier, 0) + len(
            data
        )
        self.stats.tier_restore_seconds[tier] = (
            self.stats.tier_restore_seconds.get(tier, 0.0) + seconds
        )
        log.info(
            "restored %d cached tokens from the %s tier (%.1f MiB in %.3f s)",
            op.p1,
            tier,
            len(data) / MiB,
            seconds,
        )
        return True

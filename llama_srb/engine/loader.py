"""Settings → a running engine: model, context, engine, engine thread."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import llama_cpp as C

from llama_srb.config import FlashAttn, Settings, SplitMode
from llama_srb.engine.engine import Engine
from llama_srb.engine.kv import KvBudget
from llama_srb.engine.native import Context, ContextOptions, Model, ModelOptions
from llama_srb.engine.runtime import Runtime

log = logging.getLogger(__name__)

_SPLIT = {
    SplitMode.none: C.LLAMA_SPLIT_MODE_NONE,
    SplitMode.layer: C.LLAMA_SPLIT_MODE_LAYER,
    SplitMode.row: C.LLAMA_SPLIT_MODE_ROW,
}


_FLASH = {
    FlashAttn.auto: C.LLAMA_FLASH_ATTN_TYPE_AUTO,
    FlashAttn.on: C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    FlashAttn.off: C.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


@dataclass
class LoadedEngine:
    model: Model
    context: Context
    engine: Engine
    runtime: Runtime

    @property
    def n_ctx(self) -> int:
        return self.context.n_ctx

    def close(self) -> None:
        self.runtime.stop()
        self.engine.close()
        self.context.close()
        self.model.close()


def model_options(settings: Settings) -> ModelOptions:
    return ModelOptions(
        n_gpu_layers=settings.n_gpu_layers,
        split_mode=_SPLIT[settings.split_mode],
        main_gpu=settings.main_gpu,
        tensor_split=tuple(settings.tensor_split) if settings.tensor_split else None,
        cpu_repack=settings.cpu_repack,
    )


def kv_budget(settings: Settings) -> KvBudget:
    return KvBudget(
        settings.max_sequences,
        settings.n_ctx,
        cache_paths=settings.cache_paths,
        cache_cells=settings.cache_cells_resolved,
    )


def context_options(settings: Settings) -> ContextOptions:
    return ContextOptions(
        n_ctx=settings.n_ctx,
        n_seq_max=kv_budget(settings).n_seq,
        n_batch=settings.n_batch,
        threads=settings.threads,
        flash_attn=_FLASH[settings.flash_attn],
    )


def load_engine(settings: Settings) -> LoadedEngine:
    path = settings.resolved_model_path()
    log.info("loading %s", path)
    model = Model(path, model_options(settings))
    context = Context(model, context_options(settings))
    engine = Engine(model, context, kv_budget(settings))
    runtime = Runtime(engine)
    runtime.start()
    log.info("ready: n_ctx=%d, max_sequences=%d", context.n_ctx, settings.max_sequences)
    return LoadedEngine(model, context, engine, runtime)

"""Settings → a running engine: model, context, engine, engine thread.

The composition root of everything below the API: it alone reads Settings and builds the
native objects, the engine and its thread, so `engine` never depends on configuration.
The API gets their face only (`load_engine` → served.py's `Served`): the engine and the
llama.cpp context stay here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as C

from llama_srb.bundled_model import known_sha256
from llama_srb.config import (
    MAX_SEQUENCE_IDS,
    MIN_AUTO_N_CTX,
    BackendSampling,
    FlashAttn,
    GiB,
    Settings,
    SplitMode,
    fit_n_ctx,
)
from llama_srb.engine.device_cut import DEVICE_TOP_K
from llama_srb.engine.engine import Engine
from llama_srb.engine.kv import KvBudget
from llama_srb.engine.runtime import Runtime
from llama_srb.engine.share import ShareRules
from llama_srb.engine.tiers import DiskTier, TierStore, file_sha256
from llama_srb.engine.watch import Watchdog
from llama_srb.kv_types import DEFAULT as DEFAULT_KV_TYPE
from llama_srb.kv_types import GGML_TYPE, KvType, is_quantized, label
from llama_srb.native import (
    Context,
    ContextOptions,
    Model,
    ModelOptions,
    NativeError,
    ggml_block_size,
    ggml_row_bytes,
    has_gpu_device,
)
from llama_srb.rpc import add_rpc_servers
from llama_srb.sampling.constraint import constraints_for
from llama_srb.served import Served

log = logging.getLogger(__name__)

CPU_TOKENS_PER_CALL = 63  # below llama.cpp's CPU flash-attention tile (GGML_FA_TILE_Q, 64)
# At shutdown, how long the engine thread gets to end its step; one stuck in a native call
# never will, and the process exits without it (api/shutdown.py).
STOP_WAIT_S = 2.0

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
class _Loaded:
    """What the loader made, kept here: the API sees its face (`served`)."""

    model: Model
    context: Context
    engine: Engine
    runtime: Runtime
    # Builds the constraint tokenizer (~2 s for 262k tokens) so that the first
    # constrained request does not wait for it; it reads the model, so close() waits.
    warm_constraints: threading.Thread | None = None

    def served(self, stuck_after: float) -> Served:
        engine = self.engine
        return Served(
            model=self.model,
            n_ctx=self.context.n_ctx,
            runtime=self.runtime,
            snapshot=lambda: engine.snapshot,
            watchdog=Watchdog(engine.watch, stuck_after),
            close=self.close,
        )

    def close(self) -> bool:
        """Stop the engine thread and free the native objects; False if the thread is stuck
        in a step: then they are left to the process's exit, as it still uses them."""
        if not self.runtime.stop(STOP_WAIT_S):
            step = self.engine.watch.current
            ids = ", ".join(step.request_ids) if step is not None else "(none)"
            log.critical(
                "the engine thread is stuck in a step (requests %s): exiting without it", ids
            )
            return False
        if self.warm_constraints is not None:
            self.warm_constraints.join()
        try:
            self.engine.save_cache()
        except Exception:  # the stories are lost, not the shutdown
            log.exception("saving the prefix cache failed")
        self.engine.close()
        self.context.close()
        self.model.close()
        return True


def model_options(settings: Settings) -> ModelOptions:
    return ModelOptions(
        n_gpu_layers=settings.n_gpu_layers,
        split_mode=_SPLIT[settings.split_mode],
        main_gpu=settings.main_gpu,
        tensor_split=tuple(settings.tensor_split) if settings.tensor_split else None,
        cpu_repack=settings.cpu_repack,
    )


def offloaded(settings: Settings) -> bool:
    """Whether layers (and their KV cells) go to a GPU."""
    return settings.n_gpu_layers != 0 and has_gpu_device()


def kv_fit_error(n_ctx: int, bytes_per_cell: int, available: int | None) -> str | None:
    """Why a KV cache of `n_ctx` cells cannot fit in the host memory `available`, or None:
    a context the system cannot back would get the process killed once its cells are
    touched, taking every other model down with it."""
    need = n_ctx * bytes_per_cell
    if available is None or need <= available:
        return None
    return (
        f"--n-ctx {n_ctx} needs {need / GiB:.1f} GiB of KV cache and {available / GiB:.1f} GiB"
        " of memory are available: lower --n-ctx, or leave it out to fit it to memory"
    )


def tokens_per_call(settings: Settings) -> int:
    """--tokens-per-call, or its default: on the CPU, llama.cpp's flash attention handles
    64 or more rows in tiles that each attend over every cell any of their rows may see,
    so a step's decode rows from many requests cost more together than in calls below a
    tile (bench/bench_calls.py). Offloaded, one call per step reads the weights once."""
    if settings.tokens_per_call is not None:
        return settings.tokens_per_call
    return 0 if offloaded(settings) else CPU_TOKENS_PER_CALL


def backend_sampling(settings: Settings) -> bool:
    """--backend-sampling, auto: on where the rows are computed on a GPU."""
    if settings.backend_sampling is BackendSampling.auto:
        return offloaded(settings)
    return settings.backend_sampling is BackendSampling.on


def kv_budget(settings: Settings, n_ctx: int, tiers: TierStore | None = None) -> KvBudget:
    """The reserve's sequences come on top of --max-sequences (engine/share.py). With
    backend sampling the context has one sequence id more (its scratch, outside the
    budget), which comes out of the cached paths at llama.cpp's limit."""
    live = settings.max_sequences + settings.reserve_sequences
    cache_paths = settings.cache_paths
    if backend_sampling(settings):
        cache_paths = min(cache_paths, MAX_SEQUENCE_IDS - 1 - live)
    return KvBudget(
        live,
        n_ctx,
        cache_paths=cache_paths,
        cache_cells=settings.cache_cells_for(n_ctx),
        tiers=tiers,
    )


def tier_store(settings: Settings, model: Model, path: Path) -> TierStore | None:
    """The prefix cache's host-memory and disk tiers. A disk file is valid only for what
    gave its bytes their meaning: the model file, the llama.cpp build, the KV cache's
    types and the sliding window (positions and sequence ids are the file's own; the
    context's size and sequence count are not in the bytes)."""
    if settings.cache_cells == 0:
        return None
    disk = None
    if settings.cache_disk > 0:
        sha = known_sha256(path) or file_sha256(path, settings.cache_folder() / "model-sha256")
        disk = disk_tier(settings, sha, model.n_swa)
    ram = settings.cache_ram_bytes(available_memory())
    tiers = TierStore(ram, disk, sliding_window=model.n_swa > 0)
    log.info(
        "cache tiers: host memory %d MiB, disk %s",
        ram >> 20,
        f"{settings.cache_disk} MiB in {disk.folder}" if disk and disk.enabled else "off",
    )
    return tiers


def disk_tier(settings: Settings, model_sha256: str, n_swa: int) -> DiskTier:
    """The disk tier of one model file and one pair of KV types. Each pair gets a folder of
    its own (f16/f16 keeps the model's plain one, as before the types could be chosen): a
    server started with other types then neither restores another's files nor removes
    them as foreign, so switching back finds the stories still there. The header names the
    types too, so a file moved between folders is refused all the same."""
    types = (settings.cache_type_k, settings.cache_type_v)
    name = model_sha256[:16]
    if types != (DEFAULT_KV_TYPE, DEFAULT_KV_TYPE):
        name += f"-{types[0].value}-{types[1].value}"
    fingerprint: dict[str, object] = {
        "model_sha256": model_sha256,
        "llama_cpp": C.__version__,
        "kv_types": label(*types),
        "n_swa": n_swa,
    }
    return DiskTier(settings.cache_folder() / name, fingerprint, settings.cache_disk << 20)


def share_rules(settings: Settings, n_ctx: int) -> ShareRules:
    return ShareRules(
        client_sequences=settings.client_sequences,
        reserve_sequences=settings.reserve_sequences,
        reserve_cells=settings.reserve_cells_for(n_ctx),
    )


def context_options(settings: Settings, n_ctx: int | None = None) -> ContextOptions:
    """`n_ctx` defaults to --n-ctx, else MIN_AUTO_N_CTX (for callers without a model)."""
    n_ctx = n_ctx or settings.n_ctx or MIN_AUTO_N_CTX
    on_device = backend_sampling(settings)
    return ContextOptions(
        n_ctx=n_ctx,
        n_seq_max=kv_budget(settings, n_ctx).n_seq + on_device,
        n_batch=settings.n_batch,
        threads=settings.threads,
        flash_attn=_FLASH[flash_attn(settings)],
        type_k=GGML_TYPE[settings.cache_type_k],
        type_v=GGML_TYPE[settings.cache_type_v],
        device_top_k=DEVICE_TOP_K if on_device else 0,
        chained=settings.max_n if on_device else 0,
        cpu_cut=not offloaded(settings),
    )


def flash_attn(settings: Settings) -> FlashAttn:
    """--flash-attn, on where a quantized V cache needs it (Settings refuses it off). With
    auto llama.cpp would turn it on too, but says so only below the log level we pass on:
    deciding it here keeps what runs visible and does not rest on that."""
    if settings.flash_attn is FlashAttn.auto and is_quantized(settings.cache_type_v):
        return FlashAttn.on
    return settings.flash_attn


# -- the context size: --n-ctx, else the model's training context if memory allows --------


def available_memory() -> int | None:
    """Bytes of host memory available now (Linux's MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def head_lengths(model: Model) -> tuple[int, int]:
    """Values per head of a key and of a value."""
    arch = model.metadata("general.architecture") or ""
    head_dim = C.llama_model_n_embd(model.ptr) // max(1, C.llama_model_n_head(model.ptr))

    def length(key: str) -> int:  # Gemma's heads are wider than n_embd / n_head
        value = model.metadata(f"{arch}.attention.{key}")
        return int(value) if value and value.isdigit() else head_dim

    return length("key_length"), length("value_length")


def kv_bytes_per_cell(
    model: Model, type_k: KvType = DEFAULT_KV_TYPE, type_v: KvType = DEFAULT_KV_TYPE
) -> int:
    """Bytes one KV cell takes over all layers: a K row and a V row of every KV head, in
    the cache's types (ggml's own sizes, a quantized type's scales included)."""
    k_len, v_len = head_lengths(model)
    n_head_kv = max(1, C.llama_model_n_head_kv(model.ptr))
    row = ggml_row_bytes(GGML_TYPE[type_k], n_head_kv * k_len) + ggml_row_bytes(
        GGML_TYPE[type_v], n_head_kv * v_len
    )
    return C.llama_model_n_layer(model.ptr) * row


def kv_types_error(model: Model, type_k: KvType, type_v: KvType) -> str | None:
    """Why this model cannot keep its KV cache in these types, or None. llama.cpp refuses a
    block type whose block does not divide a head (it fails the context with a log line
    only, which the retries below would take for memory), so the reason is found here."""
    for what, kind, length in zip(("k", "v"), (type_k, type_v), head_lengths(model), strict=True):
        block = ggml_block_size(GGML_TYPE[kind])
        if length % block:
            return (
                f"--cache-type-{what} {kind.value} stores blocks of {block} values, which do"
                f" not divide this model's {length}-value heads: use f16, bf16 or f32"
            )
    return None


def open_context(model: Model, settings: Settings) -> Context:
    """A context of --n-ctx cells, or of the size `fit_n_ctx` chooses. That check sees host
    memory only; where the KV cache lives on a GPU and does not fit, halve and retry."""
    types = (settings.cache_type_k, settings.cache_type_v)
    error = kv_types_error(model, *types)
    if error is not None:
        raise ValueError(error)
    if types != (DEFAULT_KV_TYPE, DEFAULT_KV_TYPE):
        log.info("KV cache %s, flash attention %s", label(*types), flash_attn(settings).value)
    per_cell = kv_bytes_per_cell(model, *types)
    if settings.n_ctx is not None:
        if not offloaded(settings):  # the cells live in host memory: refused, not killed
            error = kv_fit_error(settings.n_ctx, per_cell, available_memory())
            if error is not None:
                raise ValueError(error)
        return Context(model, context_options(settings, settings.n_ctx))
    n_ctx, why = fit_n_ctx(model.n_ctx_train, per_cell, available_memory())
    log.info("n_ctx=%d: %s", n_ctx, why)
    while True:
        try:
            return Context(model, context_options(settings, n_ctx))
        except NativeError:
            if n_ctx <= MIN_AUTO_N_CTX:
                raise
            n_ctx = max(MIN_AUTO_N_CTX, n_ctx // 2)
            log.warning("the context did not fit in memory; trying n_ctx=%d", n_ctx)


def load_engine(settings: Settings, on_death: Callable[[str], None] | None = None) -> Served:
    """The model loaded and its engine thread running, as the API sees them. `on_death`
    is called (on the engine thread) if the engine thread ever dies."""
    path = settings.resolved_model_path()
    if settings.rpc:
        add_rpc_servers(settings.rpc)  # before the model: its loader spreads layers over them
    log.info("loading %s", path)
    model = Model(path, model_options(settings))
    context = open_context(model, settings)
    engine = Engine(
        model,
        context,
        kv_budget(settings, context.n_ctx, tier_store(settings, model, path)),
        settings.step_budget,
        tokens_per_call(settings),
        share_rules(settings, context.n_ctx),
        device_top_k=DEVICE_TOP_K if backend_sampling(settings) else 0,
        chained=settings.max_n,
    )
    runtime = Runtime(engine, on_death)
    runtime.start()
    log.info(
        "ready: n_ctx=%d, max_sequences=%d, tokens_per_call=%d, backend sampling %s",
        context.n_ctx,
        settings.max_sequences,
        engine.tokens_per_call,
        "on" if engine.device is not None else "off",
    )
    warm = threading.Thread(target=constraints_for, args=(model,), name="warm-constraints")
    warm.start()
    return _Loaded(model, context, engine, runtime, warm).served(settings.stuck_after)

"""The KV cache's element types, by llama.cpp's names (`--cache-type-k q8_0`).

The list is llama.cpp's own (`kv_cache_types` in common/arg.cpp): the types its attention
takes for K and V. A name maps to ggml's enum value only; sizes and block lengths are
asked of ggml itself (`native.ggml_row_bytes`), so nothing here can drift from the library.
No llama_cpp import: the settings read this module before any model loads.
"""

from __future__ import annotations

from enum import StrEnum


class KvType(StrEnum):
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    iq4_nl = "iq4_nl"
    q5_0 = "q5_0"
    q5_1 = "q5_1"


# enum ggml_type (ggml.h); llama-cpp-python binds no GGML_TYPE_BF16, so all are spelled here.
GGML_TYPE = {
    KvType.f32: 0,
    KvType.f16: 1,
    KvType.bf16: 30,
    KvType.q8_0: 8,
    KvType.q4_0: 2,
    KvType.q4_1: 3,
    KvType.iq4_nl: 20,
    KvType.q5_0: 6,
    KvType.q5_1: 7,
}
DEFAULT = KvType.f16  # llama.cpp's default for both


def is_quantized(kind: KvType) -> bool:
    """Stored in blocks of 32 values with a scale: llama.cpp reads such a V cache only in
    its flash-attention kernels."""
    return kind not in (KvType.f32, KvType.f16, KvType.bf16)


def label(type_k: KvType, type_v: KvType) -> str:
    """`k/v`, as the disk tier's header and the log name the pair."""
    return f"{type_k.value}/{type_v.value}"

"""--cache-type-k / --cache-type-v: llama.cpp's names, checked at startup; the context
options they become; a quantized V cache and flash attention. No model."""

from __future__ import annotations

import argparse

import llama_cpp as C
import pytest
from pydantic import ValidationError

from llama_srb.config import FlashAttn, Settings
from llama_srb.kv_types import GGML_TYPE, KvType, is_quantized
from llama_srb.loader import context_options, flash_attn
from llama_srb.native import ggml_block_size, ggml_type_name


def test_each_name_is_the_ggml_type_llama_cpp_calls_it() -> None:
    assert {kind.value for kind in KvType} == {
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
    }  # fmt: skip
    for kind, ggml_type in GGML_TYPE.items():
        assert ggml_type_name(ggml_type) == kind.value
        assert is_quantized(kind) == (ggml_block_size(ggml_type) > 1)


def test_the_flags_take_llama_cpp_names_and_default_to_f16() -> None:
    from llama_srb.cli import add_settings_flags, settings_from_args  # imports the API

    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    settings = settings_from_args(parser.parse_args([]))
    assert (settings.cache_type_k, settings.cache_type_v) == (KvType.f16, KvType.f16)
    options = context_options(settings)
    assert (options.type_k, options.type_v) == (C.GGML_TYPE_F16, C.GGML_TYPE_F16)
    args = parser.parse_args(["--cache-type-k", "q8_0", "--cache-type-v", "q4_0"])
    options = context_options(settings_from_args(args))
    assert (options.type_k, options.type_v) == (C.GGML_TYPE_Q8_0, C.GGML_TYPE_Q4_0)
    with pytest.raises(SystemExit):  # argparse: "invalid choice: 'q4_k' (choose from ...)"
        parser.parse_args(["--cache-type-k", "q4_k"])


def test_an_unknown_type_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_SRB_CACHE_TYPE_V", "q3")
    with pytest.raises(ValidationError, match="cache_type_v"):
        Settings()


def test_a_quantized_v_cache_turns_flash_attention_on_and_refuses_it_off() -> None:
    """llama.cpp reads a quantized V cache only in its flash-attention kernels: auto becomes
    on, off is refused at startup with the reason; a quantized K needs nothing."""
    quantized_v = Settings(cache_type_v=KvType.q8_0)
    assert flash_attn(quantized_v) is FlashAttn.on
    assert context_options(quantized_v).flash_attn == C.LLAMA_FLASH_ATTN_TYPE_ENABLED
    with pytest.raises(ValidationError, match="only with flash attention"):
        Settings(cache_type_v=KvType.q4_0, flash_attn=FlashAttn.off)
    for fine in (KvType.f16, KvType.bf16, KvType.f32):
        assert flash_attn(Settings(cache_type_v=fine)) is FlashAttn.auto
    quantized_k = Settings(cache_type_k=KvType.q8_0, flash_attn=FlashAttn.off)
    assert flash_attn(quantized_k) is FlashAttn.off

"""Server settings: every option declared once, with its help and bounds.

The CLI flags (`--n-ctx`) and the environment variables (`LLAMA_SRB_N_CTX`) are both
generated from these declarations, so they cannot drift apart.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SplitMode(StrEnum):
    none = "none"
    layer = "layer"
    row = "row"


class FlashAttn(StrEnum):
    auto = "auto"
    on = "on"
    off = "off"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLAMA_SRB_", frozen=True)

    model: Path | None = Field(
        None, description="GGUF model file; default: the bundled Gemma 3 270M (Q4_K_M)"
    )
    alias: str | None = Field(
        None, description="model name reported by /v1/models and accepted in requests"
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(9090, ge=0, le=65535, description="port to listen on (0: any free port)")
    n_ctx: int = Field(
        8192, ge=256, le=1 << 20, description="KV cells shared by all live sequences"
    )
    max_sequences: int = Field(
        64, ge=1, le=256, description="sequences decoded at once, across all requests"
    )
    max_n: int = Field(64, ge=1, le=256, description="largest `n` a request may ask for")
    n_batch: int = Field(
        512, ge=32, le=8192, description="tokens per llama_decode call (decode + prefill chunk)"
    )
    threads: int | None = Field(
        None, ge=1, le=512, description="CPU threads for decoding (default: all cores)"
    )
    n_gpu_layers: int = Field(
        -1, ge=-1, description="layers offloaded to the GPU (-1: all; no effect on CPU builds)"
    )
    split_mode: SplitMode = Field(SplitMode.layer, description="how to split across GPUs")
    tensor_split: list[float] | None = Field(
        None, description="fraction of the model per GPU, comma-separated (e.g. 3,1)"
    )
    main_gpu: int = Field(0, ge=0, description="GPU used with --split-mode none")
    cpu_repack: bool = Field(
        False,
        description="repack CPU weights for AMX/AVX-512 kernels (crashes where AMX is not enabled)",
    )
    flash_attn: FlashAttn = Field(FlashAttn.auto, description="flash attention")
    api_key: str | None = Field(
        None, description="require `Authorization: Bearer <key>` on /v1/* routes"
    )

    @field_validator("tensor_split", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [float(part) for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _max_n_fits(self) -> Settings:
        if self.max_n > self.max_sequences:
            raise ValueError(
                f"max_n ({self.max_n}) cannot exceed max_sequences ({self.max_sequences}):"
                " a request's n sequences must all be live at once"
            )
        return self

    def resolved_model_path(self) -> Path:
        """The model file to load, assembling the bundled one on first use."""
        if self.model is not None:
            return self.model
        from llama_srb.bundled_model import bundled_model_path

        return bundled_model_path()

    @property
    def model_name(self) -> str:
        """The public model id: --alias, else the file's stem."""
        if self.alias:
            return self.alias
        if self.model is not None:
            return self.model.stem
        return "gemma-3-270m-q4_k_m"

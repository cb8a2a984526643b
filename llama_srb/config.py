"""Server settings: every option declared once, with its help and bounds.

The CLI flags (`--n-ctx`) and the environment variables (`LLAMA_SRB_N_CTX`) are both
generated from these declarations, so they cannot drift apart.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path

from pydantic import Field, FilePath, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llama_srb.bundled_model import BUNDLED, bundled_model_path
from llama_srb.bundled_model import DEFAULT as DEFAULT_MODEL

MIN_AUTO_N_CTX = 4096  # as llama.cpp's --fit, never chosen lower on its own
MEMORY_MARGIN = 1 << 30  # left to compute buffers, the OS and everything else
GiB, MiB = float(1 << 30), float(1 << 20)


def default_data_dir() -> Path:
    """The per-user data folder of the XDG base directory spec (~/.local/share/llama-srb)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "llama-srb"


def fit_n_ctx(n_ctx_train: int, bytes_per_cell: int, available: int | None) -> tuple[int, str]:
    """The default context size and why: the model's training context, lowered (in steps
    of 256) until its KV cache takes at most half of the memory available beyond a margin."""
    train = n_ctx_train if n_ctx_train > 0 else MIN_AUTO_N_CTX
    kv = f"KV cache {train * bytes_per_cell / MiB:.0f} MiB"
    if available is None:
        return train, f"the model's training context ({kv}; available memory unknown)"
    fits = (available - MEMORY_MARGIN) // 2 // max(bytes_per_cell, 1) // 256 * 256
    if fits >= train:
        return train, f"the model's training context ({kv}, {available / GiB:.1f} GiB available)"
    n_ctx = max(fits, min(train, MIN_AUTO_N_CTX))
    floor = " (the floor: memory is short)" if n_ctx > fits else ""
    return n_ctx, (
        f"lowered from the model's training context ({train}, {kv}) to fit in"
        f" {available / GiB:.1f} GiB of available memory{floor}; --n-ctx sets it"
    )


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

    model: str = Field(
        DEFAULT_MODEL,
        description="a bundled model's name (`llama-srb models` lists them) or a GGUF file",
    )
    alias: str | None = Field(
        None, description="model name reported by /v1/models and accepted in requests"
    )
    chat_template: FilePath | None = Field(
        None,
        description="Jinja chat template file for /v1/chat/completions; default: the model's"
        " own (tokenizer.chat_template in the GGUF), else Gemma 3's for a Gemma 3 model, else"
        " ChatML",
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(9090, ge=0, le=65535, description="port to listen on (0: any free port)")
    n_ctx: int | None = Field(
        None,
        ge=256,
        le=1 << 20,
        description="KV cells shared by all live sequences and the prefix cache (default: the"
        " model's training context, lowered to fit in memory)",
    )
    max_sequences: int = Field(
        128, ge=1, le=256, description="sequences decoded at once, across all requests"
    )
    cache_cells: int | None = Field(
        None,
        ge=0,
        description="KV cells the prefix cache may keep for finished sequences while no running"
        " request needs them (0: no prefix reuse at all; default: all of them)",
    )
    cache_paths: int = Field(
        64,
        ge=1,
        le=255,
        description="finished sequences the prefix cache may keep while --max-sequences run"
        " (more while fewer run); max-sequences + cache-paths is at most 256",
    )
    max_n: int = Field(64, ge=1, le=256, description="largest `n` a request may ask for")
    n_batch: int = Field(
        512,
        ge=32,
        le=8192,
        description="tokens a step carries at most (decode rows + prompt chunks), and"
        " llama.cpp's batch size",
    )
    step_budget: float = Field(
        0.15,
        ge=0,
        le=10,
        description="seconds a decode step may take while streams are running: the prompt"
        " chunk beside them is sized to it from the measured prefill rate, so a long prompt"
        " never freezes them (0: no limit, every chunk fills the batch)",
    )
    tokens_per_call: int | None = Field(
        None,
        ge=0,
        le=8192,
        description="the most tokens one llama_decode call carries; a step with more makes"
        " several calls, a request's rows kept together (0: one call per step; default: 63"
        " when the CPU computes the model, below the 64-row tile at which its flash"
        " attention starts to attend over every branch's cells at once, else 0)",
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
    rpc: list[str] | None = Field(
        None,
        description="llama.cpp rpc-server workers (host:port, comma-separated) whose devices"
        " hold layers of the model, as llama.cpp's --rpc (with --n-gpu-layers, --tensor-split)",
    )
    cpu_repack: bool = Field(
        False,
        description="repack CPU weights for AMX/AVX-512 kernels (crashes where AMX is not enabled)",
    )
    flash_attn: FlashAttn = Field(FlashAttn.auto, description="flash attention")
    api_key: str | None = Field(
        None, description="require `Authorization: Bearer <key>` on /v1/* routes"
    )
    api_key_file: Path | None = Field(
        None,
        description="file of accepted API keys, one per line (# comments); adds to --api-key",
    )
    cors_origins: list[str] | None = Field(
        None,
        description="browser origins allowed to call the API, comma-separated (* for any);"
        " default: same origin only",
    )
    max_body_bytes: int = Field(
        8 << 20, ge=1024, le=1 << 30, description="largest request body accepted (else 413)"
    )
    max_queue: int = Field(
        256,
        ge=1,
        le=100_000,
        description="requests that may wait for admission; beyond that, 429 with Retry-After",
    )
    request_timeout: float = Field(
        600,
        ge=0,
        le=86_400,
        description="seconds an accepted request may take, queueing included, before it is"
        " ended with an error (0: no limit)",
    )
    shutdown_grace: float = Field(
        30,
        ge=0,
        le=3600,
        description="on SIGTERM, seconds running requests get to finish before they are ended",
    )
    log_prompts: bool = Field(False, description="include prompt text in the request log")
    data_dir: Path = Field(
        default_data_dir(),
        description="folder of the server's own data: the story library (stories.sqlite3)",
    )

    @field_validator("tensor_split", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [float(part) for part in value.split(",") if part.strip()]
        return value

    @field_validator("cors_origins", "rpc", mode="before")
    @classmethod
    def _split_commas_as_strings(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    def cache_cells_for(self, n_ctx: int) -> int:
        if self.cache_cells is None:
            # Idle cached cells slow a step far less than re-reading a story costs (README,
            # "Prefix cache"), so by default the cache may use every cell not in use.
            return n_ctx
        return min(self.cache_cells, n_ctx)

    @model_validator(mode="after")
    def _max_n_fits(self) -> Settings:
        if self.max_n > self.max_sequences:
            raise ValueError(
                f"max_n ({self.max_n}) cannot exceed max_sequences ({self.max_sequences}):"
                " a request's n sequences must all be live at once"
            )
        if self.max_sequences + self.cache_paths > 256:
            raise ValueError("max_sequences + cache_paths must be at most 256 (llama.cpp's limit)")
        return self

    @field_validator("model")
    @classmethod
    def _model_known(cls, value: str) -> str:
        if value not in BUNDLED and not Path(value).is_file():
            names = ", ".join(BUNDLED)
            raise ValueError(f"{value!r} is neither a bundled model ({names}) nor a file")
        return value

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, value: str | None) -> str | None:
        # LLAMA_SRB_API_KEY="" must not quietly mean "no auth": fail at startup instead.
        if value is not None and not value.strip():
            raise ValueError("api_key is empty: set a key, or unset the option for no auth")
        return value

    @model_validator(mode="after")
    def _key_file_has_keys(self) -> Settings:
        # Fail at startup, not open: a key file that is missing or empty must not mean "no auth".
        if self.api_key_file is not None:
            try:
                keys = self._keys_in_file(self.api_key_file)
            except OSError as exc:
                raise ValueError(f"cannot read api_key_file: {exc}") from exc
            if not keys:
                raise ValueError(f"api_key_file {self.api_key_file} holds no keys")
        return self

    @staticmethod
    def _keys_in_file(path: Path) -> list[str]:
        lines = (line.strip() for line in path.read_text().splitlines())
        return [line for line in lines if line and not line.startswith("#")]

    def api_keys(self) -> list[str]:
        """Every accepted API key (--api-key and the lines of --api-key-file); [] means open."""
        keys = [self.api_key] if self.api_key else []
        if self.api_key_file is not None:
            keys += self._keys_in_file(self.api_key_file)
        return keys

    def resolved_model_path(self) -> Path:
        """The model file to load (a bundled one is checked on first use)."""
        if self.model in BUNDLED:
            return bundled_model_path(self.model)
        return Path(self.model)

    @property
    def model_name(self) -> str:
        """The public model id: --alias, else the file's stem."""
        if self.alias:
            return self.alias
        if self.model == DEFAULT_MODEL:
            return "gemma-3-270m-q4_k_m"
        return self.model if self.model in BUNDLED else Path(self.model).stem

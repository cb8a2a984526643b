"""Server settings: every option declared once, with its help and bounds.

The CLI flags (`--n-ctx`) and the environment variables (`LLAMA_SRB_N_CTX`) are both
generated from these declarations, so they cannot drift apart.
"""

from __future__ import annotations

import ipaddress
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NamedTuple
from urllib.parse import urlsplit

from pydantic import Field, FilePath, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from llama_srb.bundled_model import BUNDLED, bundled_model_path
from llama_srb.bundled_model import DEFAULT as DEFAULT_MODEL
from llama_srb.kv_types import KvType, is_quantized

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


# A key's name: short and plain, as it labels metrics and log lines.
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


ADMIN = "admin:"  # `admin:name: key`: the key sees and manages every writer's stories


class ApiKey(NamedTuple):
    key: str
    name: str | None  # who holds it: the unit of fair share when there are several keys
    admin: bool = False  # may read and change every writer's stories


def parse_key(spec: str) -> ApiKey:
    """`key`, `name: key` (a colon and a space after a plain name) or `admin:name: key`
    (an admin's key). A key that itself holds `: ` must be given with a name; names need
    not be unique (one writer, two keys)."""
    admin = spec.lstrip().startswith(ADMIN)
    head, sep, rest = spec.lstrip().removeprefix(ADMIN if admin else "").partition(":")
    if sep and rest[:1].isspace() and KEY_NAME.fullmatch(head.strip()):
        key = rest.strip()
        if not key:
            raise ValueError(f"the API key named {head.strip()!r} is empty")
        return ApiKey(key, head.strip(), admin)
    if admin:  # `admin:` that names no one is a mistake, not a bare key
        raise ValueError(
            "`admin:` starts an admin key, written `admin:name: key` (a name, then `: `);"
            " a writer named admin needs another name"
        )
    return ApiKey(spec.strip(), None)


class SplitMode(StrEnum):
    none = "none"
    layer = "layer"
    row = "row"


MAX_SEQUENCE_IDS = 256  # llama.cpp's LLAMA_MAX_SEQ: a unified KV cache's sequence ids


class FlashAttn(StrEnum):
    auto = "auto"
    on = "on"
    off = "off"


class BackendSampling(StrEnum):
    auto = "auto"  # on when layers are offloaded to a GPU
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
    # NoDecode: the environment gives a comma list, as the flag does, not JSON
    models: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="more models to serve on demand besides --model: bundled names or GGUF"
        " files (repeat --model, or comma-separate here); a request names one in `model`",
    )
    models_dir: Path | None = Field(
        None,
        description="a folder of GGUF files, each a model served on demand under its file's stem",
    )
    models_max: int = Field(
        1,
        ge=1,
        le=16,
        description="models loaded at once; loading one more unloads the least recently"
        " used once its requests end (its cached stories go to the disk tier)",
    )
    sleep_idle_seconds: float = Field(
        0,
        ge=0,
        description="unload a model idle this long, keeping its stories on disk; the next"
        " request loads it again (0: never)",
    )
    unload_grace: float = Field(
        60,
        ge=0,
        le=3600,
        description="seconds a model being unloaded for another gives its running requests"
        " to finish; those still running then end with error `model_unloaded`",
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
        128,
        ge=1,
        le=256,
        description="sequences decoded at once by large requests, across all of them (small"
        " requests may add --reserve-sequences more)",
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
        " (more while fewer run); max-sequences + reserve-sequences + cache-paths is at most"
        " 256",
    )
    cache_ram: int | None = Field(
        None,
        ge=0,
        description="MiB of host memory for the KV state of cached paths evicted from the"
        " live cells (0: none; default: a quarter of the memory available at start, at most"
        " 8192)",
    )
    cache_disk: int = Field(
        10240,
        ge=0,
        description="MiB of disk for the KV state of cached paths, kept across restarts"
        " (0: no disk tier)",
    )
    cache_dir: Path | None = Field(
        None,
        description="folder of the disk tier (default: ~/.cache/llama-srb/kv); each model"
        " file gets its own subfolder",
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
    rpc: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="llama.cpp rpc-server workers (host:port, comma-separated) whose devices"
        " hold layers of the model, as llama.cpp's --rpc (with --n-gpu-layers, --tensor-split)",
    )
    cpu_repack: bool = Field(
        False,
        description="repack CPU weights for AMX/AVX-512 kernels (crashes where AMX is not enabled)",
    )
    flash_attn: FlashAttn = Field(FlashAttn.auto, description="flash attention")
    backend_sampling: BackendSampling = Field(
        BackendSampling.auto,
        description="llama.cpp cuts every row to its 64 most likely tokens inside"
        " llama_decode, where the model runs, and the host reads those, not the row, for"
        " requests whose samplers they decide (a top-k below 64 or greedy; no bias,"
        " penalties, DRY, grammar, logprobs or banned phrases); the first --max-n sequence"
        " ids carry the cut (auto: on when layers are offloaded to a GPU)",
    )
    cache_type_k: KvType = Field(
        KvType.f16,
        description="type of the KV cache's keys, as llama.cpp names it (q8_0 halves the"
        " cache's memory; a disk tier file of other types is never restored)",
    )
    cache_type_v: KvType = Field(
        KvType.f16,
        description="type of the KV cache's values, as --cache-type-k (a quantized one needs"
        " flash attention: --flash-attn auto turns it on)",
    )
    api_key: list[str] | None = Field(
        None,
        description="require `Authorization: Bearer <key>` on /v1/* routes; `name: key` names"
        " the key's writer (whose stories are theirs alone; in the log, the metrics and fair"
        " share), `admin:name: key` marks an admin who sees and manages every story; repeat"
        " for more keys",
    )
    api_key_file: Path | None = Field(
        None,
        description="file of accepted API keys, one per line as `key`, `name: key` or"
        " `admin:name: key` (# comments); adds to --api-key",
    )
    trusted_proxies: list[str] | None = Field(
        None,
        description="addresses or CIDR ranges of reverse proxies whose X-Forwarded-For and"
        " X-Forwarded-Proto are believed, comma-separated (default: none, the connection's"
        " own address is the client's)",
    )
    # NoDecode: the environment gives a comma list, as the flag does, not JSON
    cors_origins: Annotated[list[str], NoDecode] = Field(
        ["null", "loopback"],
        description="web pages that may call the API from a browser, comma-separated: origins"
        " (https://host:port), `null` (pages opened as files), `loopback` (localhost,"
        " 127.0.0.1, [::1], any port), `*` (any page) or `none` (the server's own pages"
        " only); with --api-key any page that sends the key may",
    )
    # NoDecode: as cors_origins
    library_origins: Annotated[list[str], NoDecode] = Field(
        [],
        description="other web sites' pages that may use the story library (/v1/stories) from"
        " a browser, comma-separated origins (https://host:port); the server's own pages"
        " always may, every other page gets 403 whatever --cors-origins allows",
    )
    story_creations: int = Field(
        60,
        ge=1,
        le=100_000,
        description="new stories one writer may make per minute (made or duplicated; a"
        " burst of this many, then one every 60/this seconds); beyond, 429 with Retry-After",
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
    client_max_queue: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="requests one client (API key name, else address with all its"
        " X-Session-Id sessions) may have waiting, a prompt list's prompts included; beyond"
        " that, 429 for that client (default: half of --max-queue, at least 1)",
    )
    client_max_sequences: int | None = Field(
        None,
        ge=1,
        le=256,
        description="live sequences one client (API key name, else address with all its"
        " sessions) may hold; its further requests wait for its own to end (default: half of"
        " --max-sequences, at least --max-n)",
    )
    reserve_sequences: int = Field(
        8,
        ge=0,
        le=128,
        description="sequences kept for small requests (n at most this, within"
        " --reserve-cells), beyond --max-sequences, so that one always starts within a step"
        " or two however busy the server is (0: no reserve)",
    )
    reserve_cells: int | None = Field(
        None,
        ge=0,
        description="KV cells large requests leave free for small ones (default: an eighth"
        " of the context)",
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
        description="on SIGTERM, seconds running requests get to finish before they are ended"
        " (/health answers 503 `draining` meanwhile)",
    )
    stuck_after: float = Field(
        120,
        ge=0,
        le=86_400,
        description="seconds one engine step may run before the server reports itself stuck:"
        " /health answers 503, new generations are refused, the log names the step's"
        " requests (0: never)",
    )
    header_timeout: float = Field(
        20,
        ge=0,
        le=3600,
        description="seconds a connection has to send a request's headers, once it waits for"
        " one (0: no limit)",
    )
    idle_timeout: float = Field(
        75,
        gt=0,
        le=3600,
        description="seconds a keep-alive connection may stay idle between requests (above"
        " the 60 s nginx keeps idle upstream connections)",
    )
    max_connections: int = Field(
        1000, ge=1, le=1_000_000, description="open HTTP connections, in total"
    )
    max_connections_per_client: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="open HTTP connections from one address (--trusted-proxies: counted in the"
        " total only)",
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

    @field_validator("cors_origins", "library_origins", "rpc", "trusted_proxies", mode="before")
    @classmethod
    def _split_commas_as_strings(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("library_origins")
    @classmethod
    def _library_origins_are_sites(cls, value: list[str]) -> list[str]:
        # `null` and `loopback` would let any sandboxed frame or local page read the stories.
        for origin in value:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
                raise ValueError(
                    f"library_origins: {origin!r} is not a web origin such as"
                    " https://notes.example.com:8443 (`null`, `loopback` and `*` are refused)"
                )
        return [origin.strip().lower().rstrip("/") for origin in value]

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_addresses(cls, value: list[str] | None) -> list[str] | None:
        for proxy in value or []:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted_proxies: {proxy!r} is not an IP address or CIDR range"
                ) from None
        return value

    def cache_cells_for(self, n_ctx: int) -> int:
        if self.cache_cells is None:
            # Idle cached cells slow a step far less than re-reading a story costs
            # (docs/benchmarks.md, "Prefix cache"): by default the cache may use every cell.
            return n_ctx
        return min(self.cache_cells, n_ctx)

    def cache_ram_bytes(self, available: int | None) -> int:
        """--cache-ram in bytes, or its default from the memory `available` at start."""
        if self.cache_ram is not None:
            return self.cache_ram << 20
        return min(8 << 30, (available or 0) // 4)

    def cache_folder(self) -> Path:
        """--cache-dir, or its default (XDG_CACHE_HOME respected, as for the models)."""
        if self.cache_dir is not None:
            return self.cache_dir
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "llama-srb" / "kv"

    def reserve_cells_for(self, n_ctx: int) -> int:
        """--reserve-cells, or its default; none without reserve sequences to use them."""
        if not self.reserve_sequences:
            return 0
        return n_ctx // 8 if self.reserve_cells is None else min(self.reserve_cells, n_ctx)

    @property
    def client_queue(self) -> int:
        """--client-max-queue, or its default."""
        return self.client_max_queue or max(1, self.max_queue // 2)

    @property
    def client_sequences(self) -> int:
        """--client-max-sequences, or its default."""
        return self.client_max_sequences or max(self.max_n, self.max_sequences // 2)

    @model_validator(mode="after")
    def _max_n_fits(self) -> Settings:
        if self.max_n > self.max_sequences:
            raise ValueError(
                f"max_n ({self.max_n}) cannot exceed max_sequences ({self.max_sequences}):"
                " a request's n sequences must all be live at once"
            )
        if self.client_sequences < self.max_n:
            raise ValueError(
                f"client_max_sequences ({self.client_sequences}) cannot be below max_n"
                f" ({self.max_n}): a client's request of n sequences must be able to run"
            )
        if self.max_sequences + self.reserve_sequences + self.cache_paths > MAX_SEQUENCE_IDS:
            raise ValueError(
                f"max_sequences + reserve_sequences + cache_paths must be at most"
                f" {MAX_SEQUENCE_IDS} (llama.cpp's limit)"
            )
        return self

    @model_validator(mode="after")
    def _quantized_v_has_flash_attention(self) -> Settings:
        # llama.cpp computes attention over a quantized V only in its flash-attention
        # kernels; with it off, the context would fail to start with a line in its log.
        if is_quantized(self.cache_type_v) and self.flash_attn is FlashAttn.off:
            raise ValueError(
                f"cache_type_v {self.cache_type_v.value} is quantized, and llama.cpp reads a"
                " quantized V cache only with flash attention: leave flash_attn at auto (it"
                " is then on) or set it on, or keep cache_type_v at f16, bf16 or f32"
            )
        return self

    @field_validator("models", mode="before")
    @classmethod
    def _models_list(cls, value: object) -> object:
        if isinstance(value, str):  # the environment's comma list
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("models")
    @classmethod
    def _models_known(cls, value: list[str] | None) -> list[str] | None:
        for each in value or []:
            cls._model_known(each)
        return value

    @field_validator("models_dir")
    @classmethod
    def _models_dir_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"models_dir {str(value)!r} is not a folder")
        return value

    @field_validator("model")
    @classmethod
    def _model_known(cls, value: str) -> str:
        if value not in BUNDLED and not Path(value).is_file():
            names = ", ".join(BUNDLED)
            raise ValueError(f"{value!r} is neither a bundled model ({names}) nor a file")
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _one_key_is_a_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("api_key")
    @classmethod
    def _keys_valid(cls, value: list[str] | None) -> list[str] | None:
        # LLAMA_SRB_API_KEY="" must not quietly mean "no auth": fail at startup instead.
        for spec in value or []:
            if not spec.strip():
                raise ValueError("api_key is empty: set a key, or unset the option for no auth")
            parse_key(spec)
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
    def _keys_in_file(path: Path) -> list[ApiKey]:
        lines = (line.strip() for line in path.read_text().splitlines())
        return [parse_key(line) for line in lines if line and not line.startswith("#")]

    def api_keys(self) -> list[ApiKey]:
        """Every accepted API key (--api-key and the lines of --api-key-file); [] means open."""
        keys = [parse_key(spec) for spec in self.api_key or []]
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

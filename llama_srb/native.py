"""Thin wrappers over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

They own native objects (model, context, batch, sampler chain), free them in the right
order, and raise on error codes. Nothing here knows about requests, sampling parameters
or HTTP: `sampling` and `engine` build on this module, never the other way round. Every call goes through `ctypes.CDLL`, which releases
the GIL while C runs, so a long `llama_decode` does not stall the asyncio thread.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as C
import numpy as np
import numpy.typing as npt

from llama_srb import _cpu_cut
from llama_srb.prefix_tokens import PrefixTokenizer

# llama.cpp's GBNF parser and its grammar sampler recurse once per nesting level (and per
# rule reference): threads that parse or sample grammars get a stack sized for the largest
# grammar sampling/grammar.py accepts. Address space only: pages are committed as used.
NATIVE_STACK_BYTES = 64 << 20

_backend_ready = False
_GGML_LOG_WARN, _GGML_LOG_CONT = 3, 5
_DEVICE_GPU, _DEVICE_IGPU = 1, 2  # enum ggml_backend_dev_type
_log_level = [0]  # level of the last message, which continuation pieces inherit
_stderr_lock = threading.Lock()
_stack_size_lock = threading.Lock()


@C.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty at load time; pass on warnings and errors only.
    if level != _GGML_LOG_CONT:
        _log_level[0] = level
    if _log_level[0] >= _GGML_LOG_WARN:
        sys.stderr.write(text.decode("utf-8", errors="replace"))


class Captured:
    text = ""  # set when the `captured_stderr` block ends


@contextmanager
def captured_stderr(echo_chars: int = 300) -> Iterator[Captured]:
    """What is written to stderr during the block: llama.cpp prints why a grammar does not
    parse there (not through its log callback), and the client should hear it. It also
    prints the client's whole grammar, so only the first `echo_chars` characters are
    passed on to the real stderr (the fd is process-wide: another thread's output caught
    meanwhile is cut short too, never held up)."""
    captured = Captured()
    with _stderr_lock, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", errors="replace")
            if captured.text:
                cut = len(captured.text) > echo_chars
                echo = captured.text[:echo_chars].rstrip() + (" […]" if cut else "")
                os.write(2, (echo + "\n").encode())


def native_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread with a stack big enough for llama.cpp's recursive code."""
    with _stack_size_lock:  # the setting is process-wide: one caller at a time
        previous = threading.stack_size(NATIVE_STACK_BYTES)  # for threads started now
        try:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    return thread


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


def release_free_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim). A request of many
    branches allocates and frees hundreds of megabytes (a vocabulary-wide candidate array
    per branch, logits rows); glibc keeps what was freed in its arenas, so without this the
    process stays at its peak after the request is gone (docs/fairness.md, Memory)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        C.llama_log_set(_log_callback, ctypes.c_void_p(0))
        C.llama_backend_init()
        _backend_ready = True


def _loaded_ggml() -> str:
    """The libggml that libllama loaded: the wheel holds copies of it under several names
    (no symlinks in wheels), and each copy has its own backend registry."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if Path(path).name.startswith("libggml.so"):
            return path
    return str(Path(C.__file__).parent / "lib" / "libggml.so.0")


@functools.cache
def ggml_library() -> ctypes.CDLL:
    """libggml, for the backend registry calls llama-cpp-python does not bind."""
    lib = ctypes.CDLL(_loaded_ggml())
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    return lib


def ggml_type_name(ggml_type: int) -> str:
    """ggml's own name of a tensor type (`q8_0`)."""
    return str(ggml_library().ggml_type_name(ggml_type).decode())


def ggml_block_size(ggml_type: int) -> int:
    """Values per block of a type (32 for q8_0; 1 for f16): a row's length must be a
    multiple of it."""
    return int(ggml_library().ggml_blck_size(ggml_type))


def ggml_row_bytes(ggml_type: int, n: int) -> int:
    """Bytes of a row of `n` values of a type, its blocks' scales included."""
    return int(ggml_library().ggml_row_size(ggml_type, n))


def has_gpu_device() -> bool:
    """Whether ggml has a device that takes offloaded layers: a GPU (dedicated or
    integrated) or an RPC worker, which ggml counts as a GPU."""
    _init_backend()  # registers the backends compiled in
    lib = ggml_library()
    return any(lib.ggml_backend_dev_by_type(kind) for kind in (_DEVICE_GPU, _DEVICE_IGPU))


class NativeError(RuntimeError):
    """llama.cpp reported a failure."""


class DecodeError(NativeError):
    def __init__(self, code: int) -> None:
        reason = {1: "no KV cache slot for the batch", 2: "aborted"}.get(code, "error")
        super().__init__(f"llama_decode failed with code {code} ({reason})")
        self.code = code


def vocab_error(tokens: Sequence[int], n_vocab: int) -> str | None:
    """Why `tokens` may not reach llama.cpp (which aborts the process on an id out of
    range), or None when every id is in the vocabulary."""
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is None:
        return None
    return f"token id {bad} is not in the vocabulary [0, {n_vocab})"


@dataclass(frozen=True)
class ModelOptions:
    n_gpu_layers: int = -1
    split_mode: int = C.LLAMA_SPLIT_MODE_LAYER
    main_gpu: int = 0
    tensor_split: tuple[float, ...] | None = None
    cpu_repack: bool = False


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(self, path: Path, options: ModelOptions | None = None) -> None:
        _init_backend()
        options = options or ModelOptions()
        params = C.llama_model_default_params()
        params.n_gpu_layers = options.n_gpu_layers
        params.split_mode = options.split_mode
        params.main_gpu = options.main_gpu
        params.use_extra_bufts = options.cpu_repack
        if options.tensor_split:
            # Kept on self: llama.cpp reads the array during loading.
            n = C.llama_max_devices()
            values = list(options.tensor_split)[:n] + [0.0] * max(0, n - len(options.tensor_split))
            self._tensor_split = (ctypes.c_float * n)(*values)
            params.tensor_split = self._tensor_split
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        self.ptr = C.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise NativeError(f"failed to load model from {path}")
        self.vocab = C.llama_model_get_vocab(self.ptr)
        self.n_vocab: int = C.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = C.llama_model_n_ctx_train(self.ptr)
        self.bos: int = C.llama_vocab_bos(self.vocab)
        self.eos: int = C.llama_vocab_eos(self.vocab)
        self.add_bos: bool = C.llama_vocab_get_add_bos(self.vocab)
        self.n_swa: int = C.llama_model_n_swa(self.ptr)  # sliding-window size; 0: none
        self.eog_tokens: tuple[int, ...] = tuple(
            t for t in range(self.n_vocab) if C.llama_vocab_is_eog(self.vocab, t)
        )
        self._pieces: dict[int, bytes] = {}
        self._memos: dict[tuple[bool, bool], PrefixTokenizer] = {}
        # First characters of the tokens that `parse_special` lets a text spell (control
        # and unknown tokens, as llama.cpp's tokenizer picks them): a text holding none of
        # them tokenizes the same without that pass, which costs a third of the time.
        special = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN
        self._special_initials = frozenset(
            self.special_piece(t)[:1]
            for t in range(self.n_vocab)
            if C.llama_vocab_get_attr(self.vocab, t) & special
        ) - {b""}

    def close(self) -> None:
        if self.ptr:
            C.llama_model_free(self.ptr)
            self.ptr = None

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):  # truncated: retry with the exact size
            buf = ctypes.create_string_buffer(n + 1)
            C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """`text` as tokens. A long text that starts like one tokenized lately reuses that
        one's tokens and tokenizes only its new end (llama_srb/prefix_tokens.py)."""
        parse_special = parse_special and self._may_spell_special(text.encode("utf-8"))
        key = (add_special, parse_special)
        memo = self._memos.get(key)
        if memo is None:
            memo = self._memos.setdefault(
                key,
                PrefixTokenizer(
                    lambda t, add: self._tokenize(t, add, parse_special), self.piece, add_special
                ),
            )
        return memo(text)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (C.llama_token * capacity)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buf = (C.llama_token * capacity)()
            n = C.llama_tokenize(
                self.vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        if n < 0:
            raise NativeError("tokenization failed")
        return list(buf[:n])

    def spells_special(self, text: str) -> bool:
        """Whether `text` holds the spelling of a control token (`<end_of_turn>`)."""
        data = text.encode("utf-8")
        if not self._may_spell_special(data):
            return False
        return self.tokenize(text, False, True) != self.tokenize(text, False, False)

    def _may_spell_special(self, data: bytes) -> bool:
        return any(c in data for c in self._special_initials)

    def piece(self, token: int) -> bytes:
        """The bytes one token contributes to generated text (cached: hot path)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            cached = buf.raw[:n]
            self._pieces[token] = cached
        return cached

    def text(self, tokens: Sequence[int]) -> str:
        """The text that `tokens` generate, their pieces joined (special tokens silent)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def vocab_error(self, tokens: Sequence[int]) -> str | None:
        return vocab_error(tokens, self.n_vocab)

    def special_piece(self, token: int) -> bytes:
        """A token's bytes with special tokens spelled out (`<bos>`, where `piece` gives
        nothing): for chat templates and /tokenize."""
        buf = ctypes.create_string_buffer(256)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def special_text(self, token: int) -> str:
        """A special token's spelling (`<bos>`); "" for -1, a token the model lacks."""
        return self.special_piece(token).decode("utf-8", errors="replace") if token >= 0 else ""

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of a token list, special tokens spelled out (the inverse of `tokenize`).
        The ids must be valid (`vocab_error`): llama.cpp aborts the process otherwise."""
        array = (C.llama_token * len(tokens))(*tokens)
        capacity = 4 * len(tokens) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(capacity)
            n = C.llama_detokenize(self.vocab, array, len(tokens), buf, capacity, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            capacity = -n  # too small: -n is the size needed
        raise NativeError("detokenization failed")


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int
    n_seq_max: int
    n_batch: int
    threads: int | None = None
    flash_attn: int = C.LLAMA_FLASH_ATTN_TYPE_AUTO
    type_k: int = C.GGML_TYPE_F16  # the KV cache's element types (enum ggml_type)
    type_v: int = C.GGML_TYPE_F16
    # Backend sampling (engine/device_cut.py): sequence ids 0..chained-1 each carry a
    # top_k(device_top_k) chain that llama_decode runs in its graph (0: none); `cpu_cut`:
    # the output rows are computed on the CPU, where _cpu_cut.c's op is the faster one.
    device_top_k: int = 0
    chained: int = 0
    cpu_cut: bool = False


def _address_of(name: str) -> Callable[[Any, int], int | None]:
    """llama.cpp's `name(ctx, i)`, returning its pointer as an address: the binding's own
    returns a ctypes pointer, and turning that into a number costs more than the call."""
    function = C.llama_cpp._lib[name]  # a function object of its own, not the binding's
    function.argtypes = [C.llama_context_p_ctypes, ctypes.c_int32]
    function.restype = ctypes.c_void_p
    return function


_sampled_candidates_at = _address_of("llama_get_sampled_candidates_ith")
_sampled_logits_at = _address_of("llama_get_sampled_logits_ith")


def _function(name: str, lib: ctypes.CDLL = C.llama_cpp._lib) -> int:
    """The address of llama.cpp's (or `lib`'s) function `name`."""
    address = ctypes.cast(lib[name], ctypes.c_void_p).value
    assert address, name
    return address


# For C loops that run a branch's chain themselves (sampling/_rows.c's pick_candidates).
SAMPLER_APPLY = _function("llama_sampler_apply")
SAMPLER_ACCEPT = _function("llama_sampler_accept")


@functools.cache
def cpu_cut_binds() -> bool:
    """Whether llama_srb/_cpu_cut.c has the functions it calls and reads ggml's tensors as
    it expects (else the cut is llama.cpp's own top_k)."""
    ggml, llama = ggml_library(), C.llama_cpp._lib
    return _cpu_cut.bind(
        tuple(
            _function(name, ggml if name.startswith("ggml_") else llama)
            for name in _cpu_cut.FUNCTIONS
        )
    )


class BufferViews:
    """Numpy views of llama.cpp's output buffers, by address and shape: a new view costs
    more than most of a step's bookkeeping, and a buffer moves only when llama.cpp
    grows it."""

    KEPT = 8

    def __init__(self) -> None:
        self._views: dict[tuple[int, type, int, int], npt.NDArray[Any]] = {}

    def of(self, address: int, kind: type, rows: int, cols: int) -> npt.NDArray[Any]:
        key = (address, kind, rows, cols)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= self.KEPT:  # buffers that moved
                self._views.clear()
            pointer: Any = ctypes.cast(address, ctypes.POINTER(kind))
            view = self._views[key] = np.ctypeslib.as_array(pointer, shape=(rows, cols))
        return view


class Context:
    """One llama.cpp context with a unified KV cache shared by all sequences.

    `kv_unified` makes `seq_cp` tag existing cells with another sequence id instead of
    copying them, so n branches of one prompt cost the prompt's cells once. `swa_full`
    keeps sliding-window layers' cells for every position, so old positions stay reusable.
    """

    def __init__(self, model: Model, options: ContextOptions) -> None:
        params = C.llama_context_default_params()
        params.n_ctx = options.n_ctx
        params.n_batch = options.n_batch
        params.n_ubatch = options.n_batch
        params.n_seq_max = options.n_seq_max
        threads = options.threads or os.cpu_count() or 1
        params.n_threads = threads
        params.n_threads_batch = threads
        params.flash_attn_type = options.flash_attn
        params.type_k = options.type_k
        params.type_v = options.type_v
        params.kv_unified = True
        params.swa_full = True
        params.no_perf = True
        self.ptr = C.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise NativeError("failed to create the llama.cpp context")
        self.model = model
        self.n_ctx: int = C.llama_n_ctx(self.ptr)
        self.n_batch: int = C.llama_n_batch(self.ptr)
        self.memory = C.llama_get_memory(self.ptr)
        self._n_outputs = 0  # logits rows of the last decode
        self._chains: list[SamplerChain] = []
        try:
            self._attach(options.device_top_k, options.chained, options.cpu_cut)
        except BaseException:
            self.close()
            raise
        self._views = BufferViews()

    def _attach(self, k: int, chained: int, cpu_cut: bool) -> None:
        """One top_k(k) chain per sequence id below `chained`, attached once: each attach
        makes llama.cpp reserve its scheduler again, which the first decode pays."""
        for seq_id in range(chained if k > 0 else 0):
            top_k = (
                ctypes.cast(_cpu_cut.sampler(k), C.llama_sampler_p_ctypes)
                if cpu_cut and cpu_cut_binds()
                else C.llama_sampler_init_top_k(k)
            )
            chain = SamplerChain.of([top_k])
            self._chains.append(chain)  # freed after the context, which uses it until then
            if not C.llama_set_sampler(self.ptr, seq_id, chain.ptr):
                raise NativeError(f"llama.cpp cannot run a top_k chain for sequence {seq_id}")

    def close(self) -> None:
        if self.ptr:
            C.llama_free(self.ptr)
            self.ptr = None
        for chain in self._chains:
            chain.close()
        self._chains = []

    def candidates(
        self, rows: Sequence[int], k: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        """The candidates the sequences' chains left on output rows `rows` (ascending,
        each of a sequence with a chain: engine/device_cut.py), at most k a row, one row
        of the matrices each, as llama.cpp left them: ids and logits."""
        ids, logits, count = self.candidate_buffers(rows, k)
        return ids[rows, :count], logits[rows, :count]

    def candidate_buffers(
        self, rows: Sequence[int], k: int
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], int]:
        """llama.cpp's buffers of the candidates on output rows `rows` (as `candidates`),
        one row for each output row of the last decode, and how many of each row's first
        are those of `rows` (at most k): views, for a reader that reads just those."""
        # llama.cpp's *_ith take a token's index in the batch, or a negative one that
        # counts output rows back from the last (as ours are numbered)
        ptr, n_outputs = self.ptr, self._n_outputs
        lo, hi = rows[0] - n_outputs, rows[-1] - n_outputs
        count = min(C.llama_get_sampled_candidates_count_ith(ptr, lo), k)
        if not count or C.llama_get_sampled_candidates_count_ith(ptr, hi) != count:
            raise NativeError("backend sampling: a row has no candidates")
        # llama.cpp keeps a row's candidates and their logits at row * n_vocab in one
        # buffer each (llama-context.cpp), checked at both ends.
        stride, whole = self.model.n_vocab, []
        for ith, kind in (
            (_sampled_candidates_at, ctypes.c_int32),
            (_sampled_logits_at, ctypes.c_float),
        ):
            first, last = ith(ptr, lo) or 0, ith(ptr, hi) or 0
            if not first or last - first != 4 * stride * (rows[-1] - rows[0]):
                raise NativeError("backend sampling: llama.cpp's candidates are not in one buffer")
            whole.append(self._views.of(first - 4 * stride * rows[0], kind, n_outputs, stride))
        return whole[0], whole[1], count

    def warm_up(self, token: int) -> None:
        """One throwaway decode, so the first request does not pay for page faults and
        first-use setup (seconds on a cold CPU)."""
        batch = Batch(1)
        try:
            batch.add(token, 0, 0, True)
            self.decode(batch)
        finally:
            batch.close()
            self.seq_rm(0, -1, -1)

    def decode(self, batch: Batch) -> None:
        self._n_outputs = 0
        code = C.llama_decode(self.ptr, batch.struct)
        if code != 0:
            raise DecodeError(code)
        # On a GPU llama_decode returns once the work is queued: wait here, so that a
        # decode's time is the device's and not the first read's after it.
        C.llama_synchronize(self.ptr)
        self._n_outputs = batch.n_outputs

    def logits(self) -> npt.NDArray[np.float32]:
        """The last decode's logits, one row per token that asked for them in batch order
        (`Batch.add` returns each one's row): a writable view of llama.cpp's buffer."""
        if not self._n_outputs:
            return np.empty((0, self.model.n_vocab), np.float32)
        ptr = C.llama_get_logits(self.ptr)
        address = ctypes.cast(ptr, ctypes.c_void_p).value or 0
        return self._views.of(address, ctypes.c_float, self._n_outputs, self.model.n_vocab)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        C.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        if not C.llama_memory_seq_rm(self.memory, seq_id, p0, p1):
            raise NativeError(f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) failed")

    def seq_pos_max(self, seq_id: int) -> int:
        """The last position `seq_id` holds (-1: none)."""
        return int(C.llama_memory_seq_pos_max(self.memory, seq_id))

    def state_get(self, seq_id: int) -> bytes:
        """One sequence's KV cells (positions, then K and V per layer) as bytes. For a
        sliding-window layer llama.cpp writes only the cells the sequence's last position
        still sees, so a restored sequence continues from its end, exactly, but cannot be
        forked from far inside it."""
        self._check_seq(seq_id)
        size = C.llama_state_seq_get_size_ext(self.ptr, seq_id, 0)
        buf = (ctypes.c_uint8 * size)()
        written = C.llama_state_seq_get_data_ext(self.ptr, buf, size, seq_id, 0)
        if written != size:
            raise NativeError(f"llama_state_seq_get_data: {written} of {size} bytes")
        return bytes(buf)

    def state_set(self, seq_id: int, data: bytes) -> bool:
        """Load `state_get`'s bytes into `seq_id`, which must hold no cells. False when
        llama.cpp refuses them (another layout, no room): the sequence is then empty."""
        self._check_seq(seq_id)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        read = C.llama_state_seq_set_data_ext(self.ptr, buf, len(data), seq_id, 0)
        if read != len(data):
            self.seq_rm(seq_id)  # a partial read may leave cells behind
            return False
        return True

    def _check_seq(self, seq_id: int) -> None:
        # llama.cpp asserts (aborting the process) on a sequence id out of range.
        if not 0 <= seq_id < C.llama_n_seq_max(self.ptr):
            raise NativeError(f"sequence id {seq_id} out of range")


class Batch:
    """A reusable `llama_batch` with room for `capacity` tokens of one sequence id each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.struct = C.llama_batch_init(capacity, 0, 1)
        self._token = self.struct.token
        self._pos = self.struct.pos
        self._n_seq_id = self.struct.n_seq_id
        self._seq_id = self.struct.seq_id
        self._logits = self.struct.logits
        self.n_tokens = 0
        self.n_outputs = 0  # tokens that asked for logits

    def clear(self) -> None:
        self.n_tokens = self.n_outputs = 0
        self.struct.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its logits row after the decode (-1: no logits)."""
        i = self.n_tokens
        if i >= self.capacity:
            raise NativeError(f"batch overflow: capacity {self.capacity}")
        self._token[i] = token
        self._pos[i] = pos
        self._n_seq_id[i] = 1
        self._seq_id[i][0] = seq_id
        self._logits[i] = logits
        self.n_tokens = i + 1
        self.struct.n_tokens = self.n_tokens
        if not logits:
            return -1
        self.n_outputs += 1
        return self.n_outputs - 1

    def add_span(
        self,
        tokens: Sequence[int],
        start_pos: int,
        seq_id: int,
        logits_last: bool,
        logits_all: bool = False,
    ) -> int:
        """Append consecutive tokens of one sequence; returns the last one's logits row
        (-1: none). `logits_all` asks for every token's logits (to score a prompt), not
        just the last."""
        last = len(tokens) - 1
        index = -1
        for offset, token in enumerate(tokens):
            logits = logits_all or (logits_last and offset == last)
            index = self.add(token, start_pos + offset, seq_id, logits)
        return index

    def close(self) -> None:
        if self.struct is not None:
            C.llama_batch_free(self.struct)
            self.struct = None


class SamplerChain:
    """Owns one native sampler chain; `sample` applies it and records the token."""

    def __init__(self, ptr: C.llama_sampler_p) -> None:
        self.ptr: C.llama_sampler_p | None = ptr

    @classmethod
    def of(cls, samplers: Sequence[C.llama_sampler_p]) -> SamplerChain:
        """A new chain that takes ownership of `samplers`, applied in order."""
        params = C.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = cls(C.llama_sampler_chain_init(params))
        chain.extend(samplers)
        return chain

    @property
    def address(self) -> int:
        """The chain's address, for C code that runs it (sampling/_rows.c)."""
        assert self.ptr is not None, "closed"
        return ctypes.cast(self.ptr, ctypes.c_void_p).value or 0

    def extend(self, samplers: Sequence[C.llama_sampler_p]) -> None:
        for sampler in samplers:
            C.llama_sampler_chain_add(self.ptr, sampler)  # the chain takes ownership

    def clone(self) -> SamplerChain:
        clone = C.llama_sampler_clone(self.ptr)
        if not clone:
            raise NativeError("llama_sampler_clone failed")
        return SamplerChain(clone)

    def sample(self, ctx: C.llama_context_p, batch_index: int) -> int:
        # llama_sampler_sample also accepts the token (penalties, DRY, grammar see it).
        return int(C.llama_sampler_sample(self.ptr, ctx, batch_index))

    def close(self) -> None:
        if self.ptr:
            C.llama_sampler_free(self.ptr)
            self.ptr = None

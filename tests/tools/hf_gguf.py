"""A Hugging Face model written as a GGUF file the way llama.cpp's converter lays it out, for
the model tests: tensor names from gguf-py's own HF -> GGUF map (not Ferry's), attn_q /
attn_k rows permuted for Llama, Gemma's norms stored as 1 + w, the metadata keys llama.cpp
reads. Matrices in one block type (vectors F32); K-quants get random valid blocks (gguf-py
cannot quantize them). Returns the weights the file really holds as an HF state dict (in the
HF model's own conventions), so that the reference model can run on exactly those.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T

K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
# HF model_type -> (GGUF architecture, gguf-py's MODEL_ARCH)
ARCHS = {"llama": ("llama", gguf.MODEL_ARCH.LLAMA), "mistral": ("llama", gguf.MODEL_ARCH.LLAMA),
         "qwen2": ("qwen2", gguf.MODEL_ARCH.QWEN2), "qwen3": ("qwen3", gguf.MODEL_ARCH.QWEN3),
         "gemma3_text": ("gemma3", gguf.MODEL_ARCH.GEMMA3),
         "phi3": ("phi3", gguf.MODEL_ARCH.PHI3),
         "qwen3_moe": ("qwen3moe", gguf.MODEL_ARCH.QWEN3MOE)}


def llama_cpp_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """convert_hf_to_gguf's permutation of attn_q / attn_k rows (HF -> GGUF)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def random_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid K-quant blocks: random bytes with sane fp16 scales (d, dmin)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    low = 0.5e-4 if qtype == T.Q6_K else 0.5e-3  # Q6_K's int8 scales are larger
    n = 1 if qtype == T.Q6_K else 2
    d = rng.uniform(low, 3 * low, size=(rows, cols // block, n)).astype(np.float16)
    if qtype == T.Q6_K:
        raw[..., -2:] = d.view(np.uint8).reshape(rows, cols // block, 2)
    else:
        raw[..., :4] = d.view(np.uint8).reshape(rows, cols // block, 4)
    return raw.reshape(rows, -1)


def _metadata(w: gguf.GGUFWriter, arch: str, cfg: Any) -> None:
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    ints = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.key_length": head_dim, "attention.value_length": head_dim,
            "vocab_size": cfg.vocab_size}
    rope = dict(cfg.rope_parameters)
    if cfg.model_type == "gemma3_text":
        rope = dict(rope["full_attention"])
        # config.json's window, as the converter writes it (transformers' config object
        # holds W // 2 + 1 for a model that attends both ways)
        ints["attention.sliding_window"] = cfg.to_dict()["sliding_window"]
    elif cfg.model_type == "qwen3_moe":
        ints.update({"expert_count": cfg.num_experts, "expert_used_count":
                     cfg.num_experts_per_tok,
                     "expert_feed_forward_length": cfg.moe_intermediate_size})
    elif getattr(cfg, "sliding_window", None) and cfg.model_type in ("mistral", "phi3"):
        ints["attention.sliding_window"] = cfg.sliding_window
    for key, value in ints.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32(f"{arch}.rope.freq_base", float(rope["rope_theta"]))
    if rope.get("rope_type", "default") == "linear":
        w.add_string(f"{arch}.rope.scaling.type", "linear")
        w.add_float32(f"{arch}.rope.scaling.factor", float(rope["factor"]))
    if rope.get("rope_type") == "longrope":  # as llama.cpp's convert_hf_to_gguf.py (Phi-3)
        original = cfg.original_max_position_embeddings
        scale = cfg.max_position_embeddings / original
        w.add_rope_dimension_count(head_dim)
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
        for tensor, key in ((gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, "long_factor"),
                            (gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT, "short_factor")):
            w.add_tensor(f"{gguf.TENSOR_NAMES[tensor]}.weight",
                         np.array(rope[key], dtype=np.float32))


def copy_tokenizer(w: gguf.GGUFWriter, source: Path, added: Sequence[str] = ()) -> None:
    """Every `tokenizer.*` field of the GGUF at `source` (its vocabulary, merges, special ids
    and chat template), with `added` appended to the vocabulary as control tokens."""
    reader = gguf.GGUFReader(source)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value = [*value, *added]
        elif key == "tokenizer.ggml.token_type":
            value = [*value, *[int(gguf.TokenType.CONTROL)] * len(added)]
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, value, field.types[0], sub)


def _blocks(stored: torch.Tensor, qtype: T, rng: np.random.Generator) -> np.ndarray:
    """A 2-D or 3-D (experts) float tensor in `qtype`'s blocks."""
    if qtype in K_QUANTS:
        rows = stored.reshape(-1, stored.shape[-1])
        return random_blocks(qtype, *rows.shape, rng).reshape(*stored.shape[:-1], -1)
    if qtype == T.F32:
        return stored.numpy()
    return gguf.quants.quantize(stored.numpy(), qtype)


def _dequant(blocks: np.ndarray, qtype: T, shape: torch.Size) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(blocks, qtype),
                                                 dtype=np.float32)).reshape(shape)


def _experts(w: gguf.GGUFWriter, key: str, value: torch.Tensor, qtype: T,
             rng: np.random.Generator) -> torch.Tensor:
    """transformers' fused experts (gate_up_proj [E, 2I, H], down_proj [E, H, I]) as
    llama.cpp's ffn_{gate,up,down}_exps; returns what the file holds, in HF's layout."""
    layer = key.split(".")[2]
    if key.endswith("gate_up_proj"):
        gate, up = value.chunk(2, dim=1)
        held = []
        for name, part in (("ffn_gate_exps", gate), ("ffn_up_exps", up)):
            blocks = _blocks(part.contiguous(), qtype, rng)
            w.add_tensor(f"blk.{layer}.{name}.weight", blocks, raw_dtype=qtype)
            held.append(_dequant(blocks, qtype, part.shape))
        return torch.cat(held, dim=1)
    blocks = _blocks(value, qtype, rng)
    w.add_tensor(f"blk.{layer}.ffn_down_exps.weight", blocks, raw_dtype=qtype)
    return _dequant(blocks, qtype, value.shape)


def write_gguf(path: Path, hf: torch.nn.Module, qtype: T = T.F32,
               types: dict[str, T] | None = None,
               tokens: list[str] | None = None, tokenizer_of: Path | None = None,
               added: Sequence[str] = (),
               metadata: Mapping[str, int | str] | None = None,
               extra: Mapping[str, np.ndarray] | None = None,
               arch: str | None = None) -> dict[str, torch.Tensor]:
    """`hf`'s weights as a GGUF: each matrix in types[GGUF short name] or `qtype`, vectors
    F32; `tokens`: a vocabulary's spellings (tokenizer.ggml.tokens, named a byte-level BPE's;
    no merges: enough to look tokens up), or `tokenizer_of`: another GGUF's whole tokenizer,
    with `added` tokens after its own; `metadata`: more keys (`qwen3.pooling_type`), `extra`:
    more tensors by GGUF name (a reranker's `cls.output.weight`); `arch`: another GGUF
    architecture of the same layout ("gemma-embedding"). Returns what the file holds as an HF
    state dict (the reference's weights)."""
    cfg = hf.config
    arch, model_arch = (arch, gguf.MODEL_ARCH[arch.upper().replace("-", "_")]) if arch \
        else ARCHS[cfg.model_type]
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    # gguf-py lists no dense MLP for qwen3moe (a config's mlp_only_layers): Qwen3's names
    dense = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, cfg.num_hidden_layers)
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    gemma = arch in ("gemma3", "gemma-embedding")
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, arch, cfg)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    if tokenizer_of is not None:
        copy_tokenizer(w, tokenizer_of, added)
    else:
        w.add_eos_token_id(2)
    if tokens is not None:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
    rng = np.random.default_rng(0)
    held: dict[str, torch.Tensor] = {}
    for key, value in hf.state_dict().items():
        base, _, kind = key.rpartition(".")
        if base == "lm_head" and cfg.tie_word_embeddings:
            continue
        if ".mlp.experts." in key:
            held[key] = _experts(w, key, value.detach().float(), (types or {}).get(
                "ffn_up_exps", qtype), rng)
            continue
        name = names.get_name(base) or dense.get_name(base)
        assert name is not None, key
        short = name.rsplit(".", 1)[-1]
        value = value.detach().float()
        if gemma and key.endswith("norm.weight"):  # llama.cpp stores Gemma's 1 + w
            w.add_tensor(f"{name}.{kind}", (value + 1).numpy())
            held[key] = value
            continue
        n_heads = 0
        if arch in ("llama", "mistral3"):  # the converter's LlamaModel.permute
            n_heads = heads if short == "attn_q" else kv if short == "attn_k" else 0
        stored = llama_cpp_permute(value, n_heads) if n_heads else value
        if value.dim() == 1:
            w.add_tensor(f"{name}.{kind}", stored.numpy())
            held[key] = value
            continue
        kind_type = (types or {}).get(short, qtype)
        blocks = _blocks(stored, kind_type, rng)
        w.add_tensor(f"{name}.{kind}", blocks, raw_dtype=kind_type)
        deq = _dequant(blocks, kind_type, stored.shape)
        if n_heads:  # back to HF's layout
            deq = deq.reshape(n_heads, -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
        held[key] = deq
    if cfg.tie_word_embeddings:
        held["lm_head.weight"] = held["model.embed_tokens.weight"]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held

"""nomic-bert (nomic-embed-text): BERT's post-norm encoder with rotary positions (rotate-half
layout, base `rope_theta`) instead of learned ones, a SwiGLU MLP, and no biases on the
projections. It runs as bert.encode with the config's `rope_theta` and `gated` set; this file
reads its config and names its tensors, under transformers' own names (`layers.N.self_attn.
q_proj`, `mlp.gate_proj`...) or the original checkpoint's (`encoder.layers.N.attn.Wqkv`,
`mlp.fc11` up, `fc12` gate, `fc2` down, `norm1`, `norm2`, `emb_ln`), as transformers renames
them.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from engine.execution.model.architectures.encoders.bert import (
    BertConfig,
    BertLayer,
    BertWeights,
    as_weight,
)
from engine.execution.model.config import UnsupportedModel
from engine.execution.model.linear_kernels import Weight, stacked_rows
from engine.execution.model.pooling import pooling_of, read_json

RENAMES = ((r"^encoder\.layers\.", "layers."), (r"^emb_ln\.", "embeddings.LayerNorm."),
           (r"\.attn\.out_proj\.", ".self_attn.o_proj."), (r"\.attn\.Wqkv\.", ".self_attn.qkv."),
           (r"\.mlp\.fc11\.", ".mlp.up_proj."), (r"\.mlp\.fc12\.", ".mlp.gate_proj."),
           (r"\.mlp\.fc2\.", ".mlp.down_proj."), (r"\.norm1\.", ".post_attention_layernorm."),
           (r"\.norm2\.", ".post_mlp_layernorm."))


def config_from_hf(cfg: Mapping[str, Any], folder: Path) -> BertConfig:
    act = cfg.get("hidden_act") or cfg.get("activation_function") or "silu"
    if act not in ("silu", "swiglu"):
        raise UnsupportedModel(f"nomic-bert activation {act!r} is not supported (SwiGLU)")
    if float(cfg.get("rotary_emb_fraction", 1.0)) != 1.0 or cfg.get("rotary_emb_interleaved"):
        raise UnsupportedModel("nomic-bert with partial or interleaved rotary embeddings is "
                               "not supported")
    rope = cfg.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta") or cfg.get("rotary_emb_base") or 1000.0)
    if rope.get("rope_type", "default") != "default" or cfg.get("rotary_scaling_factor"):
        raise UnsupportedModel("nomic-bert rope scaling is not supported")
    hidden = int(cfg.get("hidden_size") or cfg["n_embd"])
    positions = int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048)
    pooling, normalize = pooling_of(folder)
    st = read_json(folder / "sentence_bert_config.json")
    dims = read_json(folder / "config_sentence_transformers.json").get("matryoshka_dims") \
        or cfg.get("matryoshka_dims") or ()
    return BertConfig(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or cfg.get("n_inner")
                              or 4 * hidden),
        num_layers=int(cfg.get("num_hidden_layers") or cfg["n_layer"]),
        num_heads=int(cfg.get("num_attention_heads") or cfg["n_head"]),
        layer_norm_eps=float(cfg.get("layer_norm_eps") or cfg.get("layer_norm_epsilon")
                             or 1e-12),
        max_position_embeddings=positions, type_vocab_size=int(cfg.get("type_vocab_size", 2)),
        gelu="none", pooling=pooling, normalize=normalize,
        max_seq_length=min(positions, int(st.get("max_seq_length") or positions)),
        matryoshka_dims=tuple(int(d) for d in dims), rope_theta=theta, gated=True)


def canonical(name: str) -> str:
    """A checkpoint name as transformers' NomicBertModel names it (a fused Wqkv: `qkv`)."""
    name = name.removeprefix("model.").removeprefix("bert.")
    for pattern, repl in RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def weights_from_tensors(tensors: Mapping[str, Weight], cfg: BertConfig,
                         dtype: torch.dtype, device: torch.device | str) -> BertWeights:
    flat = {canonical(k): v for k, v in tensors.items()}

    def get(name: str) -> Any:
        if name not in flat:
            raise UnsupportedModel(f"the checkpoint has no tensor {name!r}")
        return as_weight(flat[name], dtype, device)

    def opt(name: str) -> Any:
        return get(name) if name in flat else None

    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        if f"{p}self_attn.qkv.weight" in flat:
            qkv = get(f"{p}self_attn.qkv.weight")
        else:
            qkv = stacked_rows([get(f"{p}self_attn.{x}_proj.weight") for x in "qkv"])
        layers.append(BertLayer(
            qkv, None, get(f"{p}self_attn.o_proj.weight"), None,
            (get(f"{p}post_attention_layernorm.weight"),
             get(f"{p}post_attention_layernorm.bias")),
            get(f"{p}mlp.up_proj.weight"), opt(f"{p}mlp.up_proj.bias"),
            get(f"{p}mlp.down_proj.weight"), opt(f"{p}mlp.down_proj.bias"),
            (get(f"{p}post_mlp_layernorm.weight"), get(f"{p}post_mlp_layernorm.bias")),
            gate_w=get(f"{p}mlp.gate_proj.weight")))
    return BertWeights(get("embeddings.word_embeddings.weight"), None,
                       get("embeddings.token_type_embeddings.weight"),
                       (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")),
                       tuple(layers))

"""Phi-3 / Phi-4 (mini): the Llama decoder with q/k/v and gate/up fused in the checkpoint as
shipped (`qkv_proj`, `gate_up_proj`: loaded one to one), LongRoPE scaling (short factors
below the original context, long ones from there, cos/sin scaled; from a GGUF, the factors
are the tensors llama.cpp's converter writes, rope_factors_long / rope_factors_short) and a
sliding window for every layer where the config sets one.

A LongRoPE position past the original context rotates by the long factors; transformers
picks the factors per forward pass by its highest position instead, so a prefill chunk that
crosses the original length differs there (below it, both use the short factors).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from engine.execution.model.config import (
    GGUFMeta,
    LayerSpec,
    ModelConfig,
    RopeSpec,
    check_act,
    gguf_common,
    gguf_rope,
    hf_common,
    hf_rope,
)
from engine.execution.model.decoder import CausalLM

LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
         "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"}


class Phi3ForCausalLM(CausalLM):
    hf_model_types = ("phi3",)
    gguf_archs = ("phi3",)
    packed_modules: ClassVar[Mapping[str, tuple[str, str]]] = {}  # fused as shipped
    gguf_layer_names: ClassVar[Mapping[str, str]] = NAMES

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        common = hf_common(cfg)
        window = cfg.get("sliding_window")
        bias = bool(cfg.get("attention_bias", False))
        return ModelConfig(**common, layers=(LayerSpec(hf_rope(cfg), window),)
                           * common["num_layers"], qkv_bias=bias, o_bias=bias,
                           hidden_act=check_act(cfg, "hidden_act", {"silu": "silu"}))

    gguf_config_tensors = (LONG, SHORT)

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        window = meta.get("attention.sliding_window", 0) or None
        rope = (gguf_longrope(meta, common["head_dim"]) if LONG in meta.tensors
                else gguf_rope(meta))
        return ModelConfig(**{**common, "qkv_bias": "blk.0.attn_qkv.bias" in meta.tensors},
                           layers=(LayerSpec(rope, window),) * common["num_layers"])


def gguf_longrope(meta: GGUFMeta, head_dim: int) -> RopeSpec:
    """LongRoPE as llama.cpp's converter writes it: the factors as two F32 tensors, the
    original context and the cos/sin scale (attn_factor) as metadata."""
    original = int(meta.get("rope.scaling.original_context_length"))
    context = int(meta.get("context_length"))
    params: dict[str, Any] = {
        "rope_type": "longrope", "original_max_position_embeddings": original,
        "factor": context / original,
        "long_factor": meta.floats(LONG), "short_factor": meta.floats(SHORT)}
    for name, key in ((LONG, "long_factor"), (SHORT, "short_factor")):
        if len(params[key]) != head_dim // 2:
            raise meta.error(f"tensor {name} holds {len(params[key])} factors, the rotary "
                             f"embedding has {head_dim // 2} frequencies")
    attn = meta.get("rope.scaling.attn_factor", None)
    if attn is not None:
        params["attention_factor"] = float(attn)
    return RopeSpec(float(meta.get("rope.freq_base", 10000.0)), params)

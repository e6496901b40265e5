"""Phi-3 / Phi-4 (mini): the Llama decoder with q/k/v and gate/up fused in the checkpoint as
shipped (`qkv_proj`, `gate_up_proj`: loaded one to one), LongRoPE scaling (short factors
below the original context, long ones from there, cos/sin scaled) and a sliding window for
every layer where the config sets one.

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
    check_act,
    gguf_common,
    gguf_rope,
    hf_common,
    hf_rope,
)
from engine.execution.model.decoder import CausalLM

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

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        if "rope_factors_long.weight" in meta.tensors:
            raise meta.error("LongRoPE factors (rope_factors_long) are not supported from "
                             "GGUF yet; its safetensors folder runs")
        window = meta.get("attention.sliding_window", 0) or None
        return ModelConfig(**{**common, "qkv_bias": "blk.0.attn_qkv.bias" in meta.tensors},
                           layers=(LayerSpec(gguf_rope(meta), window),) * common["num_layers"])

"""Qwen3: the Llama decoder with per-head RMSNorm of q and k before rotary, no biases."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from engine.execution.model.architectures.text.qwen2 import qwen_windows
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
from engine.execution.model.decoder import GGUF_LAYER, CausalLM

QK_NORM_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


class Qwen3ForCausalLM(CausalLM):
    hf_model_types = ("qwen3",)
    gguf_archs = ("qwen3",)
    gguf_layer_names: ClassVar[Mapping[str, str]] = {**GGUF_LAYER, **QK_NORM_NAMES}

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        rope = hf_rope(cfg)
        bias = bool(cfg.get("attention_bias", False))
        return ModelConfig(**hf_common(cfg),
                           layers=tuple(LayerSpec(rope, w) for w in qwen_windows(cfg)),
                           qkv_bias=bias, o_bias=bias, qk_norm=True,
                           hidden_act=check_act(cfg, "hidden_act", {"silu": "silu"}))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        return ModelConfig(**common, layers=(LayerSpec(gguf_rope(meta)),) * common["num_layers"],
                           qk_norm=True)

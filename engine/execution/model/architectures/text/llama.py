"""Llama (2, 3, SmolLM2) and Mistral: the plain pre-norm decoder with SiLU gated MLP.

Mistral's config may set a sliding window for every layer; Mistral GGUFs say "llama".
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


class LlamaForCausalLM(CausalLM):
    hf_model_types = ("llama", "mistral")
    # mistral3: Mistral 3's text model as llama.cpp's converter writes it (a Llama layout)
    gguf_archs = ("llama", "mistral3")
    gguf_permute_qk = True

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        common = hf_common(cfg)
        window = cfg.get("sliding_window")
        bias = bool(cfg.get("attention_bias", False))
        return ModelConfig(**common, layers=(LayerSpec(hf_rope(cfg), window),)
                           * common["num_layers"], qkv_bias=bias, o_bias=bias,
                           mlp_bias=bool(cfg.get("mlp_bias", False)),
                           hidden_act=check_act(cfg, "hidden_act", {"silu": "silu"}))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        window = meta.get("attention.sliding_window", 0) or None
        return ModelConfig(**common, layers=(LayerSpec(gguf_rope(meta), window),)
                           * common["num_layers"])

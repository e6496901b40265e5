"""Qwen3-MoE: Qwen3's attention (q/k norms) with a mixture-of-experts MLP in every layer
(except `mlp_only_layers`, and where `decoder_sparse_step` skips), experts stored per expert
in safetensors and as 3-D tensors in GGUF (gguf_file splits them into per-expert views)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from engine.execution.model.architectures.text.qwen3 import QK_NORM_NAMES
from engine.execution.model.config import (
    GGUFMeta,
    LayerSpec,
    ModelConfig,
    MoESpec,
    check_act,
    gguf_common,
    gguf_rope,
    hf_common,
    hf_rope,
)
from engine.execution.model.decoder import GGUF_LAYER, CausalLM, DecoderLayer
from engine.execution.model.layers.moe import MoEMLP

# GGUF's 3-D expert tensors (per layer) -> the per-expert HF module name, "{e}" the expert
EXPERT_NAMES = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj",
                "ffn_up_exps": "mlp.experts.{e}.up_proj",
                "ffn_down_exps": "mlp.experts.{e}.down_proj"}


class Qwen3MoeForCausalLM(CausalLM):
    hf_model_types = ("qwen3_moe",)
    gguf_archs = ("qwen3moe",)
    gguf_layer_names: ClassVar[Mapping[str, str]] = {
        **GGUF_LAYER, **QK_NORM_NAMES, "ffn_gate_inp": "mlp.gate"}
    gguf_expert_names: ClassVar[Mapping[str, str]] = EXPERT_NAMES

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        common = hf_common(cfg)
        n, rope = common["num_layers"], hf_rope(cfg)
        dense = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        layers = tuple(LayerSpec(rope, moe=experts > 0 and i not in dense and (i + 1) % step == 0)
                       for i in range(n))
        bias = bool(cfg.get("attention_bias", False))
        return ModelConfig(**common, layers=layers, qkv_bias=bias, o_bias=bias, qk_norm=True,
                           hidden_act=check_act(cfg, "hidden_act", {"silu": "silu"}),
                           moe=MoESpec(experts, int(cfg["num_experts_per_tok"]),
                                       int(cfg["moe_intermediate_size"]),
                                       bool(cfg.get("norm_topk_prob", True))))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        moe = MoESpec(int(meta.get("expert_count")), int(meta.get("expert_used_count")),
                      int(meta.get("expert_feed_forward_length")), True)
        n = common["num_layers"]
        layers = tuple(LayerSpec(gguf_rope(meta), moe=f"blk.{i}.ffn_gate_inp.weight"
                                 in meta.tensors) for i in range(n))
        return ModelConfig(**common, layers=layers, qk_norm=True, moe=moe)

    def make_layer(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                   device: torch.device | str | None) -> nn.Module:
        out = DecoderLayer(cfg, layer, dtype, device)
        if cfg.layers[layer].moe and cfg.moe is not None:
            out.mlp = MoEMLP(cfg.hidden_size, cfg.moe, cfg.hidden_act, dtype, device)
        return out

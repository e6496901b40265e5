"""Gemma 3 (text): local sliding-window layers and global ones (5:1 by default), each kind
with its own rope; q/k RMSNorm; four norms per layer (after attention and after the MLP as
well as before each); GELU-tanh gated MLP; embeddings scaled by sqrt(hidden); tied head.

Gemma's norms multiply by (1 + w) for a stored w. The layers use plain multiplier norms, so
safetensors weights get 1 added at load (`adapt_hf_tensor`); llama.cpp's converter stores
1 + w in the GGUF already.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from engine.execution.attention.base import AttentionBackend
from engine.execution.model.config import (
    GGUFMeta,
    LayerSpec,
    ModelConfig,
    RopeSpec,
    UnsupportedModel,
    check_act,
    gguf_common,
    gguf_rope,
    hf_common,
    hf_rope,
)
from engine.execution.model.decoder import GGUF_LAYER, CausalLM
from engine.execution.model.fused_decode import DecodeLayerSpec, describe_layer
from engine.execution.model.layers import Attention, GatedMLP, RMSNorm

LOCAL_THETA = 10000.0  # llama.cpp's rope base for Gemma 3's sliding layers where a file names none
PATTERN = 6  # every 6th layer is global, as llama.cpp assumes for Gemma 3 files


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        n, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(n, eps, dtype, device)
        self.self_attn = Attention(cfg, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(n, eps, dtype, device)
        self.pre_feedforward_layernorm = RMSNorm(n, eps, dtype, device)
        self.mlp = GatedMLP(n, cfg.intermediate_size, cfg.hidden_act, False, dtype, device)
        self.post_feedforward_layernorm = RMSNorm(n, eps, dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """As DecoderLayer.forward; the attention and MLP outputs are normed before their
        residual add."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_and_norm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(h, cos, sin, attn))
        h, residual = self.pre_feedforward_layernorm.add_and_norm(h, residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual

    def decode_spec(self, rope: int) -> DecodeLayerSpec | None:
        """The fused decoder's sandwich layer (the four norms in forward's order)."""
        return describe_layer(self.self_attn, self.mlp, (
            self.input_layernorm, self.post_attention_layernorm,
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm), rope)


class Gemma3ForCausalLM(CausalLM):
    hf_model_types = ("gemma3_text",)
    # gemma-embedding: EmbeddingGemma's text model, served as an embedding model only
    gguf_archs: ClassVar[tuple[str, ...]] = ("gemma3", "gemma-embedding")
    packed_modules: ClassVar[Mapping[str, tuple[str, str]]] = CausalLM.packed_modules
    gguf_layer_names: ClassVar[Mapping[str, str]] = {
        **GGUF_LAYER, "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        common = hf_common(cfg)
        n = common["num_layers"]
        if cfg.get("attn_logit_softcapping"):
            raise UnsupportedModel("attention logit soft-capping is not supported")
        types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % int(cfg.get("sliding_window_pattern") or PATTERN) == 0
            else "sliding_attention" for i in range(n)]
        params = cfg.get("rope_parameters") or {}
        if "full_attention" in params:  # transformers 5: one entry per layer type
            ropes = {kind: hf_rope(cfg, params[kind]) for kind in set(types)}
        else:  # transformers 4: rope_theta (+ rope_scaling) global, rope_local_base_freq local
            ropes = {"full_attention": hf_rope(cfg),
                     "sliding_attention": RopeSpec(float(cfg.get("rope_local_base_freq",
                                                                 LOCAL_THETA)))}
        window = cfg.get("sliding_window")
        layers = tuple(LayerSpec(ropes[t], window if t == "sliding_attention" else None)
                       for t in types)
        return ModelConfig(
            **{**common, "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))},
            layers=layers, qk_norm=True,
            qkv_bias=bool(cfg.get("attention_bias")), o_bias=bool(cfg.get("attention_bias")),
            attn_scale=float(cfg.get("query_pre_attn_scalar") or common["head_dim"]) ** -0.5,
            hidden_act=check_act(cfg, "hidden_activation", {"gelu_pytorch_tanh": "gelu_tanh"}),
            embed_scale=common["hidden_size"] ** 0.5,
            final_softcap=cfg.get("final_logit_softcapping"))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        n = common["num_layers"]
        pattern = meta.values.get(f"{meta.arch}.attention.sliding_window_pattern", PATTERN)
        if isinstance(pattern, list):  # per layer: True where it slides
            sliding = [bool(p) for p in pattern]
        else:
            sliding = [(i + 1) % int(pattern) != 0 for i in range(n)]
        if len(sliding) != n:
            raise meta.error(f"sliding_window_pattern has {len(sliding)} entries for {n} "
                             "layers")
        window = int(meta.get("attention.sliding_window"))
        full = gguf_rope(meta)
        local = RopeSpec(float(meta.get("rope.freq_base_swa", LOCAL_THETA)))
        # llama.cpp: 1/sqrt(hidden / heads) for the 27B model (62 layers), else 1/sqrt(head_dim)
        dim = common["hidden_size"] // common["num_heads"] if n == 62 else common["head_dim"]
        return ModelConfig(
            **common, layers=tuple(LayerSpec(local, window) if s else LayerSpec(full)
                                   for s in sliding),
            qk_norm=True, attn_scale=dim ** -0.5, hidden_act="gelu_tanh",
            embed_scale=common["hidden_size"] ** 0.5,
            final_softcap=meta.get("final_logit_softcapping", None))

    def make_layer(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                   device: torch.device | str | None) -> nn.Module:
        return Gemma3DecoderLayer(cfg, layer, dtype, device)

    def adapt_hf_tensor(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() + 1.0 if key.endswith("norm.weight") else tensor

"""Self-attention over the paged pool: fused qkv projection, optional per-head q/k RMSNorm
(Qwen3, Gemma 3), rotary, the backend's attention, output projection.

The layer's spec (model/config.py) decides its rotary embedding (the model hands this layer
the cos/sin of its spec's rope) and its window (the backend masks it per layer).
"""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.attention.base import AttentionBackend
from engine.execution.model.config import ModelConfig
from engine.execution.model.layers.linear import Linear, PackedLinear
from engine.execution.model.layers.norm import RMSNorm
from engine.execution.model.layers.rotary import rotate_


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.layer = layer
        self.spec = cfg.layers[layer]
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = PackedLinear(cfg.hidden_size, (q, kv, kv), ("q", "k", "v"),
                                     cfg.qkv_bias, dtype, device)
        self.o_proj = Linear(q, cfg.hidden_size, cfg.o_bias, dtype, device)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        t, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        # rotary results go back into qkv, so that K and V stay adjacent per token: the pool
        # then stores both with one scatter from the view `kv`
        qk = qkv[:, :(h + kvh) * d].view(t, h + kvh, d)
        if self.qk_norm:  # per-head RMSNorm before rotary
            self.q_norm.norm_heads_(qk[:, :h])
            self.k_norm.norm_heads_(qk[:, h:])
        rotate_(qk, cos, sin)  # q and k together: one call for both
        q = qkv[:, :h * d].view(t, h, d)
        kv = qkv[:, h * d:].view(t, 2, kvh, d)
        out: torch.Tensor = self.o_proj(attn.forward(q, kv, self.layer))
        return out

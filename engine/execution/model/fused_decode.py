"""Decode rounds of a few sequences with bf16 weights on CPU: one C call per decoder layer.

At batch 1 a bf16 step reads ~270 MB of weights (~18 ms here) and spends ~5 ms more in Python
and per-call overhead for ~10 kernel calls per layer. `ops.decode_layer` runs the same kernels
in the same order inside one call, so its results are those of the layer-by-layer path
(tests check them bit for bit). Used only where that path would itself run Ferry's kernels on
every operation: bf16 weights multiplied by Ferry's bf16 product (emulated-bf16 CPUs), a round
of single-token sequences, at most NATIVE_DIRECT_ROWS of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.execution.attention.base import AttentionBackend
from engine.execution.attention.torch_backend import TorchAttention
from engine.execution.model import linear_kernels
from engine.kernels import ops

if TYPE_CHECKING:
    from engine.execution.model.llama import LlamaForCausalLM


class FusedDecode:
    def __init__(self, model: LlamaForCausalLM) -> None:
        cfg = model.config
        self.dims = ops.LayerDims(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                                  cfg.num_kv_heads, cfg.head_dim, 0, cfg.rms_norm_eps,
                                  cfg.head_dim ** -0.5)
        self.layers: list[ops.LayerWeights] = []
        p = ops.pointer
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(ops.LayerWeights(
                p(layer.input_layernorm.weight), p(layer.post_attention_layernorm.weight),
                p(attn.q_norm.weight) if attn.qk_norm else None,
                p(attn.k_norm.weight) if attn.qk_norm else None,
                p(attn.qkv_proj.weight), p(attn.qkv_proj.bias),
                p(attn.o_proj.weight), p(attn.o_proj.bias),
                p(mlp.gate_up_proj.weight), p(mlp.gate_up_proj.bias),
                p(mlp.down_proj.weight), p(mlp.down_proj.bias), None))
        self._model = model  # keeps every tensor the pointers above point into alive
        self._pool: object | None = None

    @staticmethod
    def build(model: LlamaForCausalLM) -> FusedDecode | None:
        """A fused decoder for `model` where every layer's products and ops would run on
        Ferry's kernels anyway; else None."""
        weights = [m.weight for layer in model.model.layers
                   for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                             layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        if model.dtype != torch.bfloat16 or not weights or not all(
                linear_kernels.native_direct(w) for w in weights):
            return None
        return FusedDecode(model)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor] | None:
        """All layers over embeddings x [rows, hidden] -> (last layer's output, residual), or
        None when this round is not one the fused path takes."""
        rows = x.shape[0]
        if not 0 < rows <= linear_kernels.NATIVE_DIRECT_ROWS or not isinstance(
                attn, TorchAttention):
            return None
        decode = attn.native_decode_round()
        if decode is None:
            return None
        slots, pages = decode
        pool = attn.pool
        if pool is not self._pool:  # layer pointers into this pool, set once per pool
            for i, weights in enumerate(self.layers):
                weights.pages = pool.paged(i).data_ptr()
            self.dims.page_size = pool.page_size
            self._pool = pool
        x = x.contiguous()
        residual = torch.empty_like(x)
        scratch = ops.layer_scratch(self.dims, rows)
        cos, sin = cos.contiguous(), sin.contiguous()
        for i, weights in enumerate(self.layers):
            ops.decode_layer(weights, self.dims, x, residual, i == 0, cos, sin, slots, pages,
                             scratch)
        return x, residual

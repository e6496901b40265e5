"""Decode rounds of a few sequences on CPU: one C call per decoder layer.

A decode step calls ~10 kernels per layer; from Python each call costs its own dispatch and
ctypes overhead. `layer_ops.decode_layer` runs the same kernels in the same order inside one
call, so its results are those of the layer-by-layer path, bit for bit. Two variants:

* bf16 weights and activations, where that path would itself run Ferry's kernels on every
  operation (bf16 multiplied by Ferry's bf16 product on emulated-bf16 CPUs); the pool is bf16.
* float32 activations over quantized weights (engine.kernels.quant.QuantWeight, or a
  linear_kernels.SplitWeight of them: any GGUF block type, F16, BF16, F32), every product by
  `ferry_qmatmul`, as `quant.quant_matmul` multiplies below `quant.many_rows()` rows (from
  there it multiplies dequantized tiles, so the fused layer stops below it); the pool float32,
  bfloat16 or float16.

Only for rounds of single-token sequences, at most `max_rows` of them, whose attention
backend offers the round to a native decode layer (AttentionBackend.native_decode).
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, cast

import torch

from engine.execution.attention.base import AttentionBackend
from engine.execution.model import linear_kernels
from engine.kernels import layer_ops, ops, quant

if TYPE_CHECKING:
    from engine.execution.kv_pool import KVPool
    from engine.execution.model.layers import Linear
    from engine.execution.model.llama import DecoderLayer, LlamaForCausalLM
    from engine.kernels.quant import QuantWeight


def _projections(layer: DecoderLayer) -> list[Linear]:
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]


def _float(weight: linear_kernels.Weight) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise TypeError("the bf16 decode path needs float weights")
    return weight


def _bf16_layer(layer: DecoderLayer) -> ctypes.Structure:
    def p(weight: linear_kernels.Weight | None) -> int | None:
        return layer_ops.pointer(None if weight is None else _float(weight))

    attn, mlp = layer.self_attn, layer.mlp
    return layer_ops.LayerWeights(
        p(layer.input_layernorm.weight), p(layer.post_attention_layernorm.weight),
        p(attn.q_norm.weight) if attn.qk_norm else None,
        p(attn.k_norm.weight) if attn.qk_norm else None,
        p(attn.qkv_proj.weight), p(attn.qkv_proj.bias), p(attn.o_proj.weight),
        p(attn.o_proj.bias), p(mlp.gate_up_proj.weight), p(mlp.gate_up_proj.bias),
        p(mlp.down_proj.weight), p(mlp.down_proj.bias), None)


def _parts(weight: linear_kernels.Weight) -> tuple[QuantWeight, ...] | None:
    """The quantized parts of a projection's weight, or None if it is a float tensor."""
    if isinstance(weight, torch.Tensor):
        return None
    if isinstance(weight, linear_kernels.SplitWeight):
        return weight.parts
    return (weight,)


def _quant_layer(layer: DecoderLayer) -> ctypes.Structure | None:
    projections = []
    for module in _projections(layer):
        parts = _parts(module.weight)
        if parts is None or len(parts) > layer_ops.MAX_PARTS or (
                module.bias is not None and module.bias.dtype != torch.float32):
            return None
        projections.append(layer_ops.projection(parts, module.bias))
    norms = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    attn = layer.self_attn
    if attn.qk_norm:
        norms += [attn.q_norm.weight, attn.k_norm.weight]
    if not all(n.dtype == torch.float32 and n.is_contiguous() for n in norms):
        return None
    p = layer_ops.pointer
    return layer_ops.QLayerWeights(
        p(norms[0]), p(norms[1]), p(norms[2]) if attn.qk_norm else None,
        p(norms[3]) if attn.qk_norm else None, *projections, None)


class FusedDecode:
    def __init__(self, model: LlamaForCausalLM, layers: list[ctypes.Structure],
                 dtype: torch.dtype) -> None:
        cfg = model.config
        self.dims = layer_ops.LayerDims(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                                        cfg.num_kv_heads, cfg.head_dim, 0, cfg.rms_norm_eps,
                                        cfg.head_dim ** -0.5, 0, 0)
        self.layers = layers
        self.dtype = dtype  # of the activations: bf16 (ferry_layer) or float32 (ferry_qlayer)
        self.max_rows = linear_kernels.NATIVE_DIRECT_ROWS  # the layer path's few-row products
        if dtype == torch.float32:
            self.max_rows = min(self.max_rows, quant.many_rows() - 1)
        self._model = model  # keeps every tensor the pointers in `layers` point into alive
        self._pool: KVPool | None = None

    @staticmethod
    def build(model: LlamaForCausalLM) -> FusedDecode | None:
        """A fused decoder for `model` where one of the two variants applies; else None."""
        layers = cast("list[DecoderLayer]", list(model.model.layers))
        if not layers or not ops.usable(layers[0].input_layernorm.weight):
            return None
        if model.dtype == torch.bfloat16:
            if not all(isinstance(m.weight, torch.Tensor) and linear_kernels.native_direct(m.weight)
                       for layer in layers for m in _projections(layer)):
                return None
            return FusedDecode(model, [_bf16_layer(layer) for layer in layers], torch.bfloat16)
        if model.dtype == torch.float32:
            quant = [_quant_layer(layer) for layer in layers]
            if any(q is None for q in quant):
                return None
            return FusedDecode(model, quant, torch.float32)  # type: ignore[arg-type]
        return None

    def _bind(self, pool: KVPool) -> bool:
        """Point the layers at this pool (once per pool); False if this variant cannot use it."""
        if pool is self._pool:
            return True
        if pool.dtype not in ops.POOL_DT or (self.dtype == torch.bfloat16
                                             and pool.dtype != torch.bfloat16):
            return False
        for i, weights in enumerate(self.layers):
            weights.pages = pool.paged(i).data_ptr()
        self.dims.page_size = pool.page_size
        self.dims.pool_dt = ops.POOL_DT[pool.dtype]
        self._pool = pool
        return True

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor] | None:
        """All layers over embeddings x [rows, hidden] -> (last layer's output, residual), or
        None when this round is not one the fused path takes."""
        rows = x.shape[0]
        if not 0 < rows <= self.max_rows or x.dtype != self.dtype:
            return None
        decode = attn.native_decode()
        if decode is None or not self._bind(attn.pool):
            return None
        x = x.contiguous()
        residual = torch.empty_like(x)
        scratch = layer_ops.layer_scratch(self.dims, rows, self.dtype)
        cos, sin = cos.contiguous(), sin.contiguous()
        for i, weights in enumerate(self.layers):
            layer_ops.decode_layer(weights, self.dims, x, residual, i == 0, cos, sin,
                                   decode.slots, decode.pages, scratch)
        return x, residual

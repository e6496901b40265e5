"""Python entry point to the fused decoder layers (csrc/decode_layer*.c): one C call per layer.

Two variants share one call: bf16 weights and activations (`LayerWeights`, ferry_layer), or
float32 activations over quant.h's `ferry_weight` products, float or block-quantized
(`QLayerWeights`, ferry_qlayer). The structs hold raw pointers: the tensors they point into
must outlive them (engine.execution.model.fused_decode keeps the model alive).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.kernels import native
from engine.kernels.ops import DecodePages, check

if TYPE_CHECKING:
    from engine.kernels.quant import QuantWeight

LayerWeights = native.struct("ferry_layer")  # None = absent (no bias, no q/k norm)
QLayerWeights = native.struct("ferry_qlayer")
LayerDims = native.struct("ferry_dims")
Projection = native.struct("ferry_proj")
MAX_PARTS = len(Projection().part)


def pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def projection(parts: Sequence[QuantWeight], bias: torch.Tensor | None) -> ctypes.Structure:
    """A ferry_proj over row-stacked quantized parts (one, or q/k/v, gate/up), float32 bias."""
    if not 0 < len(parts) <= MAX_PARTS:
        raise ValueError(f"a fused projection has 1 to {MAX_PARTS} parts, not {len(parts)}")
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        raise ValueError("a quantized projection's bias must be contiguous float32")
    proj = Projection(parts=len(parts), bias=pointer(bias))
    for i, w in enumerate(parts):
        proj.part[i] = native.struct("ferry_weight")(
            qtype=w.qtype, data=w.data.data_ptr(), **{"in": w.in_features},
            out=w.out_features, row_bytes=w.data.shape[1])
    return proj


def layer_scratch(dims: ctypes.Structure, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Scratch for one layer call: bf16 for the bf16 layer, float32 for the float32 one."""
    n = rows * (2 * dims.hidden + (dims.heads + 2 * dims.kv_heads) * dims.dim
                + dims.heads * dims.dim + 3 * dims.inter)
    return torch.empty(n, dtype=dtype)


def decode_layer(weights: ctypes.Structure, dims: ctypes.Structure, x: torch.Tensor,
                 residual: torch.Tensor, first: bool, cos: torch.Tensor, sin: torch.Tensor,
                 slots: torch.Tensor, pages: DecodePages, scratch: torch.Tensor) -> None:
    """One decoder layer for a decode round of x.shape[0] sequences, in place: x (the previous
    layer's output) becomes this layer's output, residual the running sum (`first`: started
    from x). cos/sin: the round's rotary tables; slots/pages: the round's K/V places. x,
    residual, cos, sin and scratch are bf16 for LayerWeights, float32 for QLayerWeights."""
    lib = native.loaded()
    quantized = isinstance(weights, QLayerWeights)
    fn = lib.ferry_decode_layer_f32 if quantized else lib.ferry_decode_layer
    check(fn(ctypes.byref(weights), ctypes.byref(dims), x.shape[0], x.data_ptr(),
             residual.data_ptr(), int(first), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
             pages.page_ids.data_ptr(), pages.page_starts.data_ptr(), pages.kv_lens.data_ptr(),
             scratch.data_ptr()), "decode_layer")

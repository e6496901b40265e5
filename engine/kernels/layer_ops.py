"""Python entry point to the fused decoder layers (csrc/decode_layer.c): one C call a round.

One recipe for two activation types: bf16 activations over bf16 weights, or float32
activations over quant.h's `ferry_weight` products (float or block-quantized). The structs
hold raw pointers: the tensors they point into must outlive them
(engine.execution.model.fused_decode keeps them alive).
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
LayerDims = native.struct("ferry_dims")
Round = native.struct("ferry_round")
MAX_ROPES = len(Round().rope)  # rotary tables a round hands the layers (and KV pools)
MoE = native.struct("ferry_moe")
Projection = native.struct("ferry_proj")
MAX_PARTS = len(Projection().part)
BF16 = 30  # ggml's type id for a bf16 matrix (the bf16 layer's one part)
# the gated MLP activations the kernels run; ferry_layer.gelu and ferry_moe.gelu: the index
ACTS = ("silu", "gelu_tanh")
DT = {torch.float32: 0, torch.bfloat16: 1}


def pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def projection(parts: Sequence[QuantWeight | torch.Tensor],
               bias: torch.Tensor | None) -> ctypes.Structure:
    """A ferry_proj over row-stacked parts: quantized weights (one, or q/k/v, gate/up) with a
    float32 bias, or one contiguous bf16 matrix [out, in] with a bf16 bias."""
    if not 0 < len(parts) <= MAX_PARTS:
        raise ValueError(f"a fused projection has 1 to {MAX_PARTS} parts, not {len(parts)}")
    if bias is not None and not bias.is_contiguous():
        raise ValueError("a fused projection's bias must be contiguous")
    proj = Projection(parts=len(parts), bias=pointer(bias))
    for i, w in enumerate(parts):
        if isinstance(w, torch.Tensor):
            if w.dtype != torch.bfloat16 or not w.is_contiguous() or len(parts) != 1:
                raise ValueError("a float part must be one contiguous bf16 matrix")
            proj.part[i] = native.struct("ferry_weight")(
                qtype=BF16, data=w.data_ptr(), **{"in": w.shape[1]}, out=w.shape[0],
                row_bytes=w.shape[1] * 2)
        else:
            proj.part[i] = native.struct("ferry_weight")(
                qtype=w.qtype, data=w.data.data_ptr(), **{"in": w.in_features},
                out=w.out_features, row_bytes=w.data.shape[1])
    return proj


def layer_scratch(dims: ctypes.Structure, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Scratch for one layer call, in the activations' dtype."""
    n = rows * (2 * dims.hidden + (dims.heads + 2 * dims.kv_heads) * dims.dim
                + dims.heads * dims.dim + 3 * dims.inter)
    return torch.empty(n, dtype=dtype)


def decode_round(tables: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 places: Sequence[tuple[torch.Tensor, DecodePages]]) -> ctypes.Structure:
    """A ferry_round: each rope's (cos, sin), each pool's (slots, pages): the full layers'
    pool, then the local layers' where the model has one. The tensors must outlive it."""
    if len(tables) > MAX_ROPES or len(places) > MAX_ROPES:
        raise ValueError(f"a round takes at most {MAX_ROPES} ropes and pools")
    out = Round()
    for i, (cos, sin) in enumerate(tables):
        out.rope[i].cos, out.rope[i].sin = cos.data_ptr(), sin.data_ptr()
    for i, (slots, pages) in enumerate(places):
        p = out.pool[i]
        p.slots, p.page_ids = slots.data_ptr(), pages.page_ids.data_ptr()
        p.page_starts, p.kv_lens = pages.page_starts.data_ptr(), pages.kv_lens.data_ptr()
    return out


def decode_layers(layers: ctypes.Array[ctypes.Structure], dims: ctypes.Structure,
                  x: torch.Tensor, residual: torch.Tensor, round_: ctypes.Structure,
                  scratch: torch.Tensor) -> None:
    """One decoder layer after another over x [rows, hidden] for a decode round, in place: x
    becomes the last layer's output, residual the running sum (started from x). Each layer
    takes its rope's tables and its pool's places from `round_` (its `rope` and `local`
    fields)."""
    check(native.loaded().ferry_decode_layers(
        layers, len(layers), ctypes.byref(dims), DT[x.dtype], x.shape[0], x.data_ptr(),
        residual.data_ptr(), ctypes.byref(round_), scratch.data_ptr()), "decode_layers")


def moe(router: Sequence[QuantWeight], experts: Sequence[tuple[Sequence[QuantWeight],
                                                               Sequence[QuantWeight]]],
        top_k: int, normalize: bool, act: str, inter: int) -> ctypes.Structure:
    """A ferry_moe over the router's and each expert's (gate_up, down) parts. The expert
    projection arrays hang on the struct (`keep`): it must outlive the calls."""
    gate_up = (Projection * len(experts))(*(projection(g, None) for g, _ in experts))
    down = (Projection * len(experts))(*(projection(d, None) for _, d in experts))
    out = MoE(router=projection(router, None), gate_up=ctypes.addressof(gate_up),
              down=ctypes.addressof(down), experts=len(experts), top_k=top_k,
              normalize=int(normalize), gelu=ACTS.index(act), inter=inter)
    out.keep = (gate_up, down)
    return out


def moe_mlp(m: ctypes.Structure, x: torch.Tensor) -> torch.Tensor:
    """The mixture-of-experts MLP over float32 rows x [rows, hidden] (csrc/moe.c)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    check(native.loaded().ferry_moe_mlp(ctypes.byref(m), x.data_ptr(), x.shape[0], x.shape[1],
                                        out.data_ptr()), "moe_mlp")
    return out

"""Decode rounds of a few sequences on CPU: one C call for all decoder layers.

A decode step calls ~10 kernels per layer; from Python each call costs its own dispatch and
ctypes overhead. `layer_ops.decode_layers` runs the same kernels in the same order, every
layer in one call, so its results are those of the layer-by-layer path, bit for bit.

The model describes its layers neutrally (`DecodeLayerSpec`: the norms, a sandwich layer's
four, the projections or a native mixture of experts, the activation, the rope, the window;
each layer's `decode_spec`, None where a layer is not this recipe) and the executor builds a
FusedDecode from that where one of two variants applies:

* bf16 weights and activations, where the layer path would itself run Ferry's kernels on
  every operation (bf16 multiplied by Ferry's bf16 product on emulated-bf16 CPUs); the pool
  bf16.
* float32 activations over quantized weights (engine.kernels.quant.QuantWeight, or a
  linear_kernels.SplitWeight of them: any GGUF block type, F16, BF16, F32), every product by
  `ferry_qmatmul` or, where quant.quant_matmul would turn to it, the AMX kernel (so up to
  `quant.native_rows`: from there quant_matmul multiplies dequantized tiles, so the fused
  layer stops below it); the pool float32, bfloat16 or float16.

Only for rounds of single-token sequences, at most `max_rows` of them, whose attention
backend offers the round to a native decode layer (AttentionBackend.native_decode).
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.execution.attention.base import AttentionBackend
from engine.execution.model import linear_kernels
from engine.execution.model.config import ModelConfig
from engine.kernels import layer_ops, ops, quant

if TYPE_CHECKING:
    from torch import nn

    from engine.execution.model.layers import Attention, Linear, RMSNorm


@dataclass(frozen=True)
class DecodeLayerSpec:
    """One layer as the fused recipe runs it: x + attn(norm(x)) with optional per-head q/k
    norms, then + down(act(gate) * up)(norm(...)). A sandwich layer (Gemma 3: `ffn_norm`
    set) norms the attention output by `post_norm` before adding it, adds it in `ffn_norm`,
    and norms the MLP's output by `out_norm`. Projections in order qkv, o, gate_up, down;
    `rope`: the index of the layer's rotary tables among the model's."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    projections: tuple[Linear, ...]  # qkv, o (and gate_up, down unless `moe`)
    window: int | None
    act: str = "silu"  # or "gelu_tanh"
    ffn_norm: torch.Tensor | None = None
    out_norm: torch.Tensor | None = None
    rope: int = 0
    moe: ctypes.Structure | None = None  # a layer_ops.MoE for a mixture-of-experts MLP

    @property
    def norms(self) -> list[torch.Tensor | None]:
        """In ferry_layer's order."""
        return [self.input_norm, self.post_norm, self.q_norm, self.k_norm, self.ffn_norm,
                self.out_norm]


MAX_ROWS = 64  # decode rounds of more sequences run layer by layer (the same bits)


def describe_layer(attn: Attention, mlp: nn.Module, norms: Sequence[RMSNorm], rope: int
                   ) -> DecodeLayerSpec | None:
    """A layer of `attn`, a gated MLP (or a mixture of them the native MoE runs) and its
    norms (input, post-attention; a sandwich layer's pre- and post-MLP too), or None where
    the recipe cannot run the MLP."""
    from engine.execution.model.layers import GatedMLP, MoEMLP

    weights = [n.weight for n in norms]
    ffn, out = weights[2:] if len(weights) == 4 else (None, None)
    q_norm, k_norm = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (None, None)
    if isinstance(mlp, MoEMLP):
        moe = mlp.native()
        if moe is None:
            return None
        return DecodeLayerSpec(weights[0], weights[1], q_norm, k_norm, (attn.qkv_proj, attn.o_proj),
                               attn.spec.window, mlp.act, ffn, out, rope, moe)
    if not isinstance(mlp, GatedMLP) or mlp.act not in layer_ops.ACTS:
        return None
    return DecodeLayerSpec(
        weights[0], weights[1], q_norm, k_norm,
        (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj), attn.spec.window,
        mlp.act, ffn, out, rope)


def _block_parts(modules: Iterable[Linear]) -> list[quant.QuantWeight]:
    return [part for module in modules for part in module.block_parts(layer_ops.MAX_PARTS) or ()]


def fused_rows(modules: Iterable[Linear], most: int) -> int:
    """The most rows (at most `most`) for which each quantized one of these projections runs
    in the kernels the fused layer has (quant.native_rows)."""
    return min([most, *(quant.native_rows(part) for part in _block_parts(modules))])


def per_row_rows(modules: Iterable[Linear], most: int) -> int:
    """The most rows (at most `most`) that every quantized one of these projections multiplies
    as it does one row (int8 products per row): below where quant_matmul turns to AMX or to
    dequantized tiles for one of them. A speculative round's rows stay within it, so each row's
    numbers are those of plain decoding."""
    return min([most, *(quant.many_rows(part.qtype) - 1 for part in _block_parts(modules))])


def _parts(module: Linear, bf16: bool) -> Sequence[torch.Tensor | quant.QuantWeight] | None:
    """The matrices of a projection as the recipe multiplies them, or None where it cannot."""
    w = module.weight
    if bf16:
        if not isinstance(w, torch.Tensor) or not linear_kernels.native_direct(w):
            return None
        return [w]
    return module.block_parts(layer_ops.MAX_PARTS)


def _layer(spec: DecodeLayerSpec, dtype: torch.dtype) -> ctypes.Structure | None:
    norms = spec.norms
    if not all(n is None or (n.dtype == dtype and n.is_contiguous()) for n in norms):
        return None
    if spec.moe is not None and dtype != torch.float32:
        return None
    projections = []
    for module in spec.projections:
        parts = _parts(module, dtype == torch.bfloat16)
        if parts is None:
            return None
        projections.append(layer_ops.projection(parts, module.bias))
    if spec.moe is not None:  # the MoE call replaces gate_up and down
        projections += [layer_ops.Projection(), layer_ops.Projection()]
    p = layer_ops.pointer
    moe = None if spec.moe is None else ctypes.addressof(spec.moe)
    return layer_ops.LayerWeights(*(p(n) for n in norms), *projections, moe, None,
                                  spec.window or 0, layer_ops.ACTS.index(spec.act))


class FusedDecode:
    def __init__(self, cfg: ModelConfig, layers: list[ctypes.Structure], ropes: list[int],
                 dtype: torch.dtype, max_rows: int, per_row: int, keep: object) -> None:
        self.dims = layer_ops.LayerDims(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                                        cfg.num_kv_heads, cfg.head_dim, 0, cfg.rms_norm_eps,
                                        cfg.scale, 0, 0)
        self.layers = layers
        self.ropes = ropes  # per layer: the index of its rotary tables
        self.dtype = dtype  # of the activations: bf16 or float32
        self.max_rows = max_rows  # the most rows of a round it takes
        self.per_row = per_row  # of those, the most whose products run row by row (int8)
        self._keep = keep  # keeps every tensor the pointers in `layers` point into alive
        self._bound: AttentionBackend | None = None
        self._any_local = False  # some layer's K/V live in the local layers' pool
        self._array: ctypes.Array[ctypes.Structure] | None = None  # self.layers, bound

    @staticmethod
    def build(cfg: ModelConfig, specs: list[DecodeLayerSpec] | None, dtype: torch.dtype,
              keep: object) -> FusedDecode | None:
        """A fused decoder for these layers (activations in `dtype`) where one of the two
        variants applies; else None. `keep`: the model owning the tensors."""
        if not specs or dtype not in (torch.bfloat16, torch.float32) \
                or not ops.usable(specs[0].input_norm):
            return None
        if max(spec.rope for spec in specs) >= layer_ops.MAX_ROPES:
            return None
        layers = [_layer(spec, dtype) for spec in specs]
        if any(layer is None for layer in layers):
            return None
        if dtype == torch.bfloat16:  # the layer path's few-row products
            max_rows = per_row = linear_kernels.NATIVE_DIRECT_ROWS
        else:
            modules = [module for spec in specs for module in spec.projections]
            max_rows = fused_rows(modules, MAX_ROWS)
            per_row = per_row_rows(modules, MAX_ROWS)
        return FusedDecode(cfg, layers, [spec.rope for spec in specs],  # type: ignore[arg-type]
                           dtype, max_rows, per_row, keep)

    def _bind(self, attn: AttentionBackend) -> bool:
        """Point the layers at this backend's pools (once per backend); False if this variant
        cannot use them. A local (sliding-window) layer reads the local layers' pool."""
        if attn is self._bound:
            return True
        pools = [attn.pool] if attn.local_pool is None else [attn.pool, attn.local_pool]
        for pool in pools:
            if pool.dtype not in ops.POOL_DT or (self.dtype == torch.bfloat16
                                                 and pool.dtype != torch.bfloat16):
                return False
        for i, weights in enumerate(self.layers):
            pool, index, local = attn.place(i)
            weights.pages = pool.paged(index).data_ptr()
            weights.rope, weights.local = self.ropes[i], int(local)
        self._any_local = any(weights.local for weights in self.layers)
        # the layers side by side for the one call a round (copies of the structs: the
        # pointers in them stay valid while self.layers keeps the tensors)
        self._array = (layer_ops.LayerWeights * len(self.layers))(*self.layers)
        self.dims.page_size = attn.pool.page_size
        self.dims.pool_dt = ops.POOL_DT[attn.pool.dtype]
        self._bound = attn
        return True

    def run(self, x: torch.Tensor, tables: Sequence[tuple[torch.Tensor, torch.Tensor]],
            attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor] | None:
        """All layers over embeddings x [rows, hidden] -> (last layer's output, residual), or
        None when this round is not one the fused path takes. tables: the round's (cos, sin)
        per rope of the model."""
        rows = x.shape[0]
        if not 0 < rows <= self.max_rows or x.dtype != self.dtype:
            return None
        decode = attn.native_decode()
        if decode is None or not self._bind(attn):
            return None
        x = x.contiguous()
        residual = torch.empty_like(x)
        scratch = layer_ops.layer_scratch(self.dims, rows, self.dtype)
        tables = [(cos.contiguous(), sin.contiguous()) for cos, sin in tables]
        places = [decode.at(False)] + ([decode.at(True)] if self._any_local else [])
        assert self._array is not None
        layer_ops.decode_layers(self._array, self.dims, x, residual,
                                layer_ops.decode_round(tables, places), scratch)
        return x, residual

"""Projections: a plain Linear, and PackedLinear for several stacked along the output rows.

Parameters are created uninitialised (`torch.empty`, usually on the meta device): the weight
loop (model/weights.py) replaces every one, so random init would only cost time. A weight is
a float parameter, or after loading a plain attribute in the layout its product runs from
(linear_kernels: oneDNN-packed, quantized blocks, or the parts of a fused projection).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from engine.execution.model import linear_kernels
from engine.kernels import quant


def _param(*shape: int, dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b); a plain projection whose checkpoint tensor maps one to one.

    `weight` is a float parameter, or after loading a plain attribute: a oneDNN-packed
    tensor, a quant.QuantWeight, a linear_kernels.SplitWeight or blocks on the device
    (gpu_quant.DeviceQuantWeight; `set_quantized`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight: linear_kernels.Weight = _param(out_features, in_features, dtype=dtype,
                                                    device=device)
        self.bias = _param(out_features, dtype=dtype, device=device) if bias else None
        self.product: linear_kernels.Product = linear_kernels.linear  # chooses per call
        self.wide: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x, self.weight, self.bias)

    def set_quantized(self, weight: linear_kernels.Weight,
                      bias: torch.Tensor | None = None) -> None:
        """Replace the float weight by a quantized one (and the bias by `bias`, as float32,
        where given): its products run on it."""
        del self.weight
        self.weight = weight
        if bias is not None:
            self.bias = nn.Parameter(bias.float(), requires_grad=False)
        self.product = linear_kernels.product_for(weight)

    def pack(self, wide: bool = False) -> None:
        """Once loaded: swap the weight for the layout its products run fastest from (a
        packed weight is a plain tensor attribute, no longer a loadable parameter), keep a
        float32 copy of an emulated-bf16 weight for many-row products if `wide`, and fix the
        product function for both."""
        if not isinstance(self.weight, torch.Tensor):  # quantized
            self.product = linear_kernels.product_for(self.weight)
            return
        packed = linear_kernels.pack(self.weight)
        if packed is not self.weight:
            del self.weight
            self.weight = packed
        if wide and linear_kernels.wants_wide_copy(self.weight):
            self.wide = linear_kernels.wide_copy(self.weight)
        self.product = linear_kernels.product_for(self.weight, self.wide)


    def block_parts(self, max_parts: int) -> tuple[quant.QuantWeight, ...] | None:
        """The ferry_weight parts of this projection as native kernels multiply them with
        float32 activations (one, or a SplitWeight's), or None where they cannot: a float
        tensor weight, too many parts, a bias not float32."""
        w = self.weight
        if not isinstance(w, (quant.QuantWeight, linear_kernels.SplitWeight)):
            return None  # float, or blocks on the device
        parts = w.parts if isinstance(w, linear_kernels.SplitWeight) else (w,)
        if len(parts) > max_parts or (self.bias is not None
                                      and self.bias.dtype != torch.float32):
            return None
        return parts


class PackedLinear(Linear):
    """Several projections of the same input stacked along the output rows (qkv, gate_up).

    One matmul instead of three (or two) saves kernel launches and Python work per layer;
    `shards` names the checkpoint pieces in row order, e.g. ("q", "k", "v"), and
    `shard_sizes` their rows: the weight loop stacks the pieces in that order.
    """

    def __init__(self, in_features: int, out_sizes: Sequence[int], shards: Sequence[str],
                 bias: bool, dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        super().__init__(in_features, sum(out_sizes), bias, dtype, device)
        self.shards = tuple(shards)
        self.shard_sizes = tuple(out_sizes)
        offsets = [0, *itertools.accumulate(out_sizes)]
        self.shard_rows = {name: (offsets[i], out_sizes[i]) for i, name in enumerate(shards)}

"""Building blocks of a Llama-family decoder: norms, fused linears, rotary embedding.

Parameters are created uninitialised (`torch.empty`): every one is overwritten by the loader,
so random init would only cost time. Fused projections carry a `weight_loader` that copies one
Hugging Face shard (q/k/v or gate/up) into its rows, so checkpoint loading stays a name mapping.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.execution.model import linear_kernels
from engine.kernels import ops

if TYPE_CHECKING:
    from engine.kernels.quant import QuantWeight

def _param(*shape: int, dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, "
                         f"checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.dim = dim
        self.weight = _param(dim, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if ops.usable(x):
            return ops.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor,
                     residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's residual add and the next norm: residual + x, and its norm.
        `residual` may be updated in place (it is the layer stack's own running sum)."""
        if ops.usable(x):
            return ops.rms_norm(x, self.weight, self.eps, residual), residual
        residual = residual + x
        return F.rms_norm(residual, (self.dim,), self.weight, self.eps), residual


class Linear(nn.Module):
    """y = x W^T (+ b); a plain projection whose checkpoint tensor maps one to one.

    `weight` is a float parameter, or after loading a plain attribute: a oneDNN-packed
    tensor, a quant.QuantWeight or a linear_kernels.SplitWeight (`set_quantized`)."""

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
        """Replace the float weight (and bias) by a quantized one: its products run on it."""
        del self.weight
        self.weight = weight
        if self.bias is not None:
            if bias is None:
                raise ValueError("a biased projection needs its bias")
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


class PackedLinear(Linear):
    """Several projections of the same input stacked along the output rows (qkv, gate_up).

    One matmul instead of three (or two) saves kernel launches and Python work per layer;
    `shards` names the checkpoint pieces in row order, e.g. ("q", "k", "v").
    """

    def __init__(self, in_features: int, out_sizes: Sequence[int], shards: Sequence[str],
                 bias: bool, dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        super().__init__(in_features, sum(out_sizes), bias, dtype, device)
        offsets = [0, *itertools.accumulate(out_sizes)]
        self.shard_rows = {name: (offsets[i], out_sizes[i]) for i, name in enumerate(shards)}
        for p in (self.weight, self.bias):
            if isinstance(p, nn.Parameter):  # both are, until loaded (bias: or None)
                p.weight_loader = self._load_shard  # type: ignore[attr-defined]
                p.num_shards = len(shards)  # type: ignore[attr-defined]

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard: str) -> None:
        start, size = self.shard_rows[shard]
        target = param.data.narrow(0, start, size)
        if target.shape != loaded.shape:
            raise ValueError(f"shard {shard}: expected {tuple(target.shape)}, "
                             f"checkpoint has {tuple(loaded.shape)}")
        target.copy_(loaded)


class Embedding(nn.Module):
    """Token embeddings: a float table, or a quant.QuantWeight whose looked-up rows alone are
    dequantized (`set_quantized`)."""

    def __init__(self, num: int, dim: int, dtype: torch.dtype,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight: torch.Tensor | QuantWeight = _param(num, dim, dtype=dtype, device=device)

    def set_quantized(self, weight: QuantWeight) -> None:
        del self.weight
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, torch.Tensor):
            return F.embedding(ids, self.weight)
        from engine.kernels import quant

        return quant.dequantize_rows(self.weight, ids)  # [n, dim] float32


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, computed in place in the gate half (gate_up is a temporary)."""
    if ops.usable(gate_up):
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate, inplace=True).mul_(up)


# --- rotary position embedding -------------------------------------------------------------

ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, theta: float, rope: dict[str, Any]) -> torch.Tensor:
    """Inverse frequencies for `rope_type` in ROPE_TYPES, as Hugging Face computes them."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rope["factor"])
    if kind == "llama3":
        factor = float(rope["factor"])
        low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old_ctx = float(rope["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_type {kind!r} is not supported (supported: {ROPE_TYPES})")


class RotaryEmbedding(nn.Module):
    """cos/sin of the round's positions, computed once per round (not per layer) in fp32 as
    HF does; no table, since one for 128k positions would take 100+ MB.

    HF rotates with `x*cos + rotate_half(x)*sin`, rotate_half(x) = cat(-x2, x1). We fold the
    sign into sin (cat(-s, s)) so that rotate_half becomes a plain roll:
    x*cos + roll(x, d/2) * sin_signed, i.e. three ops.
    """

    inv_freq: torch.Tensor  # a non-persistent buffer (register_buffer)

    def __init__(self, head_dim: int, max_positions: int, theta: float, rope: dict[str, Any],
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        inv = rope_inv_freq(head_dim, theta, rope)
        self.register_buffer("inv_freq", inv.to(device), persistent=False)

    def forward(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> (cos, sin_signed), each [T, 1, head_dim] in `dtype`."""
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} beyond the model's "
                             f"{self.max_positions} positions")
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        cos = torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(1)
        sin = torch.cat((-sin, sin), dim=-1).to(dtype).unsqueeze(1)
        return cos, sin


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate x [T, heads, head_dim] in place (x may be a view into wider token rows, with
    heads and head_dim contiguous); cos/sin from RotaryEmbedding."""
    if ops.usable(x):
        ops.rotary(x, cos, sin)
    else:  # both operands of addcmul are temporaries, so writing into x is safe
        torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), sin, out=x)

"""RMSNorm, with the residual add fused in (`add_and_norm`).

The weight is the multiplier itself: Gemma's checkpoints store w for a (1 + w) multiplier,
which its architecture file turns into 1 + w at load (GGUF files store 1 + w already).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.execution.model.layers.linear import _param
from engine.kernels import ops


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

    def norm_heads_(self, x: torch.Tensor) -> None:
        """The norm of each head vector of x [tokens, heads, dim] in place (QK-norm; x may
        be a view of the fused qkv)."""
        if ops.usable(x) and x.stride(2) == 1 and x.stride(1) == self.dim:
            ops.head_norm_(x, self.weight, self.eps)
        else:
            x.copy_(self.forward(x))

    def add_and_norm(self, x: torch.Tensor,
                     residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's residual add and the next norm: residual + x, and its norm.
        `residual` may be updated in place (it is the layer stack's own running sum)."""
        if ops.usable(x):
            return ops.rms_norm(x, self.weight, self.eps, residual), residual
        residual = residual + x
        return F.rms_norm(residual, (self.dim,), self.weight, self.eps), residual

"""Token embeddings: a float table, or quantized blocks (on the host or on the device) whose
looked-up rows alone are dequantized."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.execution.model.layers.linear import _param

if TYPE_CHECKING:
    from engine.kernels.gpu_quant import DeviceQuantWeight
    from engine.kernels.quant import QuantWeight


class Embedding(nn.Module):
    """Token embeddings: a float table, or a quant.QuantWeight (rows as float32) or a
    gpu_quant.DeviceQuantWeight (rows in the model's dtype) whose looked-up rows alone are
    dequantized (`set_quantized`)."""

    def __init__(self, num: int, dim: int, dtype: torch.dtype,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        self.weight: torch.Tensor | QuantWeight | DeviceQuantWeight = _param(
            num, dim, dtype=dtype, device=device)

    def set_quantized(self, weight: QuantWeight | DeviceQuantWeight) -> None:
        del self.weight
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, torch.Tensor):
            return F.embedding(ids, self.weight)
        from engine.kernels import gpu_quant, quant

        if isinstance(self.weight, gpu_quant.DeviceQuantWeight):
            return gpu_quant.dequantize_rows(self.weight, ids, self.dtype)

        return quant.dequantize_rows(self.weight, ids)  # [n, dim] float32

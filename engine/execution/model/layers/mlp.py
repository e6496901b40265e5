"""The gated MLP: down(act(gate(x)) * up(x)), gate and up as one fused projection."""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.model.layers.activation import ACTIVATIONS
from engine.execution.model.layers.linear import Linear, PackedLinear


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.act = act
        self.act_and_mul = ACTIVATIONS[act]
        self.gate_up_proj = PackedLinear(hidden, (inter, inter), ("gate", "up"), bias, dtype,
                                         device)
        self.down_proj = Linear(inter, hidden, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act_and_mul(self.gate_up_proj(x)))
        return out

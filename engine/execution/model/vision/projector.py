"""LLaVA's multimodal projector: two linear layers with a GELU between, from the tower's
width to the text model's."""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.model.layers import Linear
from engine.execution.model.vision.clip import TOWER_ACTS, Activation


class MLPProjector(nn.Module):
    def __init__(self, vision: int, text: int, act: str, bias: bool, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.act: Activation = TOWER_ACTS[act]
        self.linear_1 = Linear(vision, text, bias, dtype, device)
        self.linear_2 = Linear(text, text, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[R, vision width] -> [R, text width]."""
        out: torch.Tensor = self.linear_2(self.act(self.linear_1(x)))
        return out

"""Gemma 3's multimodal projector: the tower's grid of patches average-pooled to the image's
tokens (a square of them), RMS-normed (Gemma's 1 + w, added at load) and projected to the
text model's width by one matrix stored [vision width, text width]."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.execution.model.layers import RMSNorm


class PooledProjector(nn.Module):
    def __init__(self, vision: int, text: int, patches_per_side: int, tokens_per_side: int,
                 eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.patches_per_side = patches_per_side
        self.kernel = patches_per_side // tokens_per_side
        self.mm_soft_emb_norm = RMSNorm(vision, eps, dtype, device)
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(vision, text, dtype=dtype, device=device), requires_grad=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[B, patches, vision width] -> [B, tokens, text width]."""
        b, _, d = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(b, d, side, side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        norm = self.mm_soft_emb_norm  # in float32, as transformers' Gemma3RMSNorm
        normed = F.rms_norm(pooled.float(), (d,), norm.weight.float(), norm.eps)
        normed = normed.to(patches.dtype)
        return normed @ self.mm_input_projection_weight

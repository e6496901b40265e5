"""SmolVLM's (Idefics3's) connector: a pixel shuffle folds each `scale` x `scale` block of
patches into one row (`scale`^2 times as wide), then one linear layer without a bias maps it
to the text model's width: a 32 x 32 patch grid becomes 64 rows at scale 4."""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.model.layers import Linear


class ModalityProjection(nn.Module):
    def __init__(self, width: int, text: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.proj = Linear(width, text, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x)
        return out


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[B, N, D] over a square grid -> [B, N / scale^2, D * scale^2], in transformers' order."""
    b, n, d = x.shape
    side = int(n ** 0.5)
    x = x.view(b, side, side // scale, d * scale).permute(0, 2, 1, 3)
    x = x.reshape(b, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(b, n // (scale * scale), d * scale * scale)


class PixelShuffleConnector(nn.Module):
    def __init__(self, vision: int, text: int, scale: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.scale = scale
        self.modality_projection = ModalityProjection(vision * scale * scale, text, dtype,
                                                      device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, patches, vision width] -> [B, patches / scale^2, text width]."""
        shuffled = pixel_shuffle(x, self.scale)
        b, n, d = shuffled.shape
        out: torch.Tensor = self.modality_projection(shuffled.reshape(b * n, d))
        return out.view(b, n, -1)

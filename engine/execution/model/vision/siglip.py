"""SigLIP's ViT image encoder (SmolVLM's tower): patch embedding with a bias, learned
positions and no class token, the same pre-norm layers as CLIP's (clip.VisionLayer), then a
post-layernorm over every patch.

A tile smaller or larger than the tower's `image_size` keeps its grid of positions: each
patch takes the position its fraction of the way across the tile falls in (NaViT's buckets,
as transformers' Idefics3 computes them); a tile of `image_size` takes positions 0..N-1."""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.model.encoder_steps import EncoderSteps, run_through
from engine.execution.model.vision.clip import VisionEncoder
from engine.execution.model.vision.config import TowerConfig


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.patch_size = cfg.patch_size
        self.per_side = cfg.image_size // cfg.patch_size
        self.patch_embedding = nn.Conv2d(3, d, cfg.patch_size, cfg.patch_size, dtype=dtype,
                                         device=device)
        self.position_embedding = nn.Embedding(cfg.num_patches, d, dtype=dtype, device=device)

    def positions(self, rows: int, cols: int, device: torch.device) -> torch.Tensor:
        """[rows * cols] position ids of a rows x cols grid of patches, bucketed in float32
        as transformers does it (so its rounding at a bucket's edge is the same)."""
        side = self.per_side
        edges = torch.arange(1 / side, 1.0, 1 / side, device=device)

        def buckets(n: int) -> torch.Tensor:
            step = 1.0 / torch.tensor([n], dtype=torch.float32, device=device)
            coords = torch.arange(n, dtype=torch.float32, device=device) * step
            return torch.bucketize(coords.clamp(max=1.0 - 1e-6), edges, right=True)

        return (buckets(rows)[:, None] * side + buckets(cols)[None, :]).reshape(-1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels)  # [B, D, rows, cols]
        rows, cols = patches.shape[2], patches.shape[3]
        ids = self.positions(rows, cols, pixels.device)
        out: torch.Tensor = patches.flatten(2).transpose(1, 2) + self.position_embedding(ids)[None]
        return out


class SiglipVisionTower(nn.Module):
    """pixels [B, 3, H, W] -> the post-layernormed last layer [B, patches, D]."""

    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(cfg, dtype, device)
        self.encoder = VisionEncoder(cfg, dtype, device)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype=dtype,
                                           device=device)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return run_through(self.steps(pixels))

    def steps(self, pixels: torch.Tensor) -> EncoderSteps:
        x: torch.Tensor = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
            yield
        out: torch.Tensor = self.post_layernorm(x)
        return out

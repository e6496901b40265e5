"""The ViT image encoder of CLIP (LLaVA's tower): patch embedding, class token, learned
positions, a pre-layernorm, then pre-norm transformer layers with bidirectional attention.

Images of one size run as a batch [B, 3, H, W]; no KV, no paging: an image is encoded whole,
once, and its output cached (engine.execution.image_encoder)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

from engine.execution.model.encoder_steps import EncoderSteps, run_through
from engine.execution.model.layers import Linear
from engine.execution.model.vision.config import TowerConfig


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return functional.gelu(x, approximate="tanh")


Activation = Callable[[torch.Tensor], torch.Tensor]
TOWER_ACTS: dict[str, Activation] = {"quick_gelu": quick_gelu, "gelu_pytorch_tanh": gelu_tanh,
                                     "gelu_tanh": gelu_tanh, "gelu": functional.gelu}


class VisionAttention(nn.Module):
    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.q_proj = Linear(d, d, True, dtype, device)
        self.k_proj = Linear(d, d, True, dtype, device)
        self.v_proj = Linear(d, d, True, dtype, device)
        self.out_proj = Linear(d, d, True, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, D] -> [B, N, D], every patch attending to every patch of its image."""
        b, n, d = x.shape
        flat = x.reshape(b * n, d)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.num_heads, -1).transpose(1, 2)

        out = functional.scaled_dot_product_attention(
            heads(self.q_proj(flat)), heads(self.k_proj(flat)), heads(self.v_proj(flat)))
        projected: torch.Tensor = self.out_proj(out.transpose(1, 2).reshape(b * n, d))
        return projected.view(b, n, d)


class VisionMLP(nn.Module):
    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.act: Activation = TOWER_ACTS[cfg.hidden_act]
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, True, dtype, device)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, True, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out: torch.Tensor = self.fc2(self.act(self.fc1(x.reshape(-1, shape[-1]))))
        return out.view(shape)


class VisionLayer(nn.Module):
    """Pre-norm: x + attn(ln1(x)), then + mlp(ln2(...)) (CLIP's and SigLIP's alike)."""

    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(d, eps, dtype=dtype, device=device)
        self.self_attn = VisionAttention(cfg, dtype, device)
        self.layer_norm2 = nn.LayerNorm(d, eps, dtype=dtype, device=device)
        self.mlp = VisionMLP(cfg, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        out: torch.Tensor = x + self.mlp(self.layer_norm2(x))
        return out


class VisionEncoder(nn.Module):
    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(cfg, dtype, device) for _ in range(cfg.layers))


class ClipEmbeddings(nn.Module):
    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.patch_size = cfg.patch_size
        self.class_embedding = nn.Parameter(torch.empty(d, dtype=dtype, device=device),
                                            requires_grad=False)
        self.patch_embedding = nn.Conv2d(3, d, cfg.patch_size, cfg.patch_size, bias=False,
                                         dtype=dtype, device=device)
        self.position_embedding = nn.Embedding(cfg.num_patches + 1, d, dtype=dtype,
                                               device=device)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [B, N, D]
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight[None]


class ClipVisionTower(nn.Module):
    """pixels [B, 3, H, W] -> the output of the last layer run [B, 1 + patches, D]."""

    def __init__(self, cfg: TowerConfig, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.embeddings = ClipEmbeddings(cfg, dtype, device)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype=dtype,
                                         device=device)  # the checkpoint's spelling
        self.encoder = VisionEncoder(cfg, dtype, device)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return run_through(self.steps(pixels))

    def steps(self, pixels: torch.Tensor) -> EncoderSteps:
        x: torch.Tensor = self.pre_layrnorm(self.embeddings(pixels))
        for layer in self.encoder.layers:
            x = layer(x)
            yield
        return x

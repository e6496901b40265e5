"""Pixtral's vision transformer (Mistral 3's tower): an image of any size (its sides whole
patches) as its grid of patches, no learned positions but 2D rotary ones (a patch's row turns
half of each head's pairs, its column the other half), RMSNorm before every block, and a
SwiGLU MLP. No class token, no final norm: the last layer's rows are the features. Module
names are the checkpoint's (`vision_tower.` stripped), so its weights load as they are."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from engine.execution.model.encoder_steps import EncoderSteps, run_through
from engine.execution.model.layers import Linear, RMSNorm
from engine.execution.model.vision.clip import TOWER_ACTS, Activation
from engine.execution.model.vision.config import PixtralViTConfig

PIXTRAL_ACTS: dict[str, Activation] = {**TOWER_ACTS, "silu": functional.silu}
NORM_EPS = 1e-5  # transformers hard-codes it for every norm of the tower


def rotary(cfg: PixtralViTConfig, rows: int, cols: int,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [rows * cols, head_dim] float32 of a rows x cols grid of patches, row by
    row: of the head's frequency pairs, the even ones turn by the patch's row and the odd
    ones by its column, in the rotate-half layout."""
    d = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device)
                                   / d)  # [d / 2]
    r = torch.arange(rows, dtype=torch.float32, device=device)
    c = torch.arange(cols, dtype=torch.float32, device=device)
    by_row = (r[:, None] * inv[None, 0::2])[:, None, :].expand(rows, cols, d // 4)
    by_col = (c[:, None] * inv[None, 1::2])[None, :, :].expand(rows, cols, d // 4)
    angles = torch.cat([by_row, by_col], dim=-1).reshape(rows * cols, d // 2)
    angles = torch.cat([angles, angles], dim=-1)  # [N, d]
    return angles.cos(), angles.sin()


def _turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, d] rotated by (cos, sin) [N, 1, d] (rotate_half), in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class PixtralAttention(nn.Module):
    def __init__(self, cfg: PixtralViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        d, inner = cfg.hidden_size, cfg.num_heads * cfg.head_dim
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.q_proj = Linear(d, inner, False, dtype, device)
        self.k_proj = Linear(d, inner, False, dtype, device)
        self.v_proj = Linear(d, inner, False, dtype, device)
        self.o_proj = Linear(inner, d, False, dtype, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """[N, D] (one image's patches) -> [N, D]: every patch attends to every patch."""
        n, h, hd = x.shape[0], self.heads, self.head_dim
        q = _turned(self.q_proj(x).view(n, h, hd), cos, sin)
        k = _turned(self.k_proj(x).view(n, h, hd), cos, sin)
        v = self.v_proj(x).view(n, h, hd)
        # [1, H, N, hd]: 3-D inputs take torch's slow math path on the CPU
        out = functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
        projected: torch.Tensor = self.o_proj(out[0].transpose(0, 1).reshape(n, h * hd))
        return projected


class PixtralMLP(nn.Module):
    """down(act(gate(x)) * up(x)), as the checkpoint stores them, without biases."""

    def __init__(self, cfg: PixtralViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        d, inter = cfg.hidden_size, cfg.intermediate_size
        self.act: Activation = PIXTRAL_ACTS[cfg.hidden_act]
        self.gate_proj = Linear(d, inter, False, dtype, device)
        self.up_proj = Linear(d, inter, False, dtype, device)
        self.down_proj = Linear(inter, d, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return out


class PixtralLayer(nn.Module):
    """Pre-norm (RMSNorm): x + attention(attention_norm(x)), then + feed_forward(...)."""

    def __init__(self, cfg: PixtralViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, NORM_EPS, dtype, device)
        self.attention = PixtralAttention(cfg, dtype, device)
        self.ffn_norm = RMSNorm(cfg.hidden_size, NORM_EPS, dtype, device)
        self.feed_forward = PixtralMLP(cfg, dtype, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class PixtralTransformer(nn.Module):
    def __init__(self, cfg: PixtralViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PixtralLayer(cfg, dtype, device) for _ in range(cfg.layers))


class PixtralVisionTower(nn.Module):
    """One image's pixels [3, H, W] (H and W whole patches) -> its patches' features
    [H / patch * W / patch, D], row by row."""

    def __init__(self, cfg: PixtralViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_conv = nn.Conv2d(3, cfg.hidden_size, cfg.patch_size, cfg.patch_size,
                                    bias=False, dtype=dtype, device=device)
        self.ln_pre = RMSNorm(cfg.hidden_size, NORM_EPS, dtype, device)
        self.transformer = PixtralTransformer(cfg, dtype, device)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return run_through(self.steps(pixels))

    def steps(self, pixels: torch.Tensor) -> EncoderSteps:
        p = self.cfg.patch_size
        rows, cols = pixels.shape[-2] // p, pixels.shape[-1] // p
        w = self.patch_conv.weight
        # one kernel per patch and no overlap: a product with each flattened patch
        patches = pixels.to(w.dtype).reshape(3, rows, p, cols, p)
        patches = patches.permute(1, 3, 0, 2, 4).reshape(rows * cols, -1)  # [N, 3 * P * P]
        x: torch.Tensor = self.ln_pre(functional.linear(patches, w.view(w.shape[0], -1)))
        cos, sin = (t[:, None, :] for t in rotary(self.cfg, rows, cols, x.device))
        for layer in self.transformer.layers:
            x = layer(x, cos, sin)
            yield
        return x

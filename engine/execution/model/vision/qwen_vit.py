"""Qwen2.5-VL's vision transformer: an image of any size (a multiple of 28 pixels a side) as
its grid of 14-pixel patches, 2D rotary positions instead of learned ones, attention within
windows of 8 x 8 patches in most layers and over the whole image in a few
(`fullatt_block_indexes`), then each 2 x 2 group of patches merged into one row of the text
model's width.

Windows keep the cost of a large image linear in its patches; the few full layers let them
exchange information. The patches come in merge-group order (Qwen2VLImageProcessor's: the
four patches of each 2 x 2 group in a row); the tower reorders whole groups so that each
window's patches are contiguous, as transformers does, and puts the merged rows back in the
image's order at the end. Module names are the checkpoint's (`visual.` stripped), so its
weights load as they are."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from engine.execution.model.encoder_steps import EncoderSteps, run_through
from engine.execution.model.layers import Linear, RMSNorm, rotate_
from engine.execution.model.vision.clip import TOWER_ACTS, Activation
from engine.execution.model.vision.config import QwenViTConfig

QWEN_ACTS: dict[str, Activation] = {**TOWER_ACTS, "silu": functional.silu}
NORM_EPS = 1e-6  # transformers hard-codes it for every norm of the tower


def window_order(rows: int, cols: int, merge: int, window: int,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, tuple[int, ...]]:
    """The windows of a rows x cols grid of patches: its merge groups (numbered row by row
    over the (rows / merge) x (cols / merge) grid of groups) in window order [groups], and
    each window's length in patches. Windows are `window` x `window` groups, row by row, the
    last of a row or column smaller where the grid does not divide (transformers pads them
    and drops the padding: the same windows)."""
    if rows % merge or cols % merge:
        raise ValueError(f"a grid of {rows} x {cols} patches is not in {merge} x {merge} groups")
    g_rows, g_cols = rows // merge, cols // merge
    groups = torch.arange(g_rows * g_cols, device=device).view(g_rows, g_cols)
    parts = [groups[r:r + window, c:c + window].reshape(-1)
             for r in range(0, g_rows, window) for c in range(0, g_cols, window)]
    return torch.cat(parts), tuple(p.numel() * merge * merge for p in parts)


class Windows:
    """Attention within windows, all in one call: the sequence (in window order, each
    window a contiguous run) scattered into a [windows, longest] batch; a key mask hides the
    padding of shorter windows (none where all are as long)."""

    def __init__(self, lengths: tuple[int, ...], device: torch.device) -> None:
        self.count, self.longest = len(lengths), max(lengths)
        sizes = torch.tensor(lengths, device=device)
        starts = torch.cumsum(sizes, 0) - sizes  # [windows] each window's first row
        window = torch.repeat_interleave(torch.arange(self.count, device=device), sizes)
        offset = torch.arange(sum(lengths), device=device) - starts[window]
        self.slots = window * self.longest + offset  # [N] each row's place in the batch
        self.mask: torch.Tensor | None = None
        if min(lengths) != self.longest:
            keys = torch.arange(self.longest, device=device)
            self.mask = (keys[None, :] < sizes[:, None])[:, None, None, :]  # [W, 1, 1, L]

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        """[N, H, hd] -> [W, H, L, hd]."""
        h, d = x.shape[1:]
        if self.mask is None:  # windows of one length: the rows are the batch already
            return x.reshape(self.count, self.longest, h, d).transpose(1, 2)
        out = x.new_zeros(self.count * self.longest, h, d)
        out[self.slots] = x
        return out.view(self.count, self.longest, h, d).transpose(1, 2)

    def unbatch(self, x: torch.Tensor) -> torch.Tensor:
        """[W, H, L, hd] -> [N, H, hd]."""
        w, h, length, d = x.shape
        rows = x.transpose(1, 2).reshape(w * length, h, d)
        return rows if self.mask is None else rows[self.slots]


class PatchEmbed(nn.Module):
    def __init__(self, cfg: QwenViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        t, p = cfg.temporal_patch_size, cfg.patch_size
        # the checkpoint's Conv3d, its weight as stored [D, C, T, P, P]; one kernel per patch
        # and no overlap, so it is a product with the flattened patch
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, (t, p, p), (t, p, p),
                              bias=False, dtype=dtype, device=device)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[N, C * T * P * P] -> [N, D]."""
        w = self.proj.weight
        return functional.linear(patches.to(w.dtype), w.view(w.shape[0], -1))


class VisionAttention(nn.Module):
    def __init__(self, cfg: QwenViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(d, 3 * d, True, dtype, device)
        self.proj = Linear(d, d, True, dtype, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                windows: Windows | None) -> torch.Tensor:
        """[N, D] -> [N, D]: attention within `windows`, or over all of x where None."""
        n, h, hd = x.shape[0], self.num_heads, self.head_dim
        qkv = self.qkv(x)  # [N, 3D]
        qk = qkv[:, :2 * h * hd].float().view(n, 2 * h, hd)  # rotated in float32, as in HF
        rotate_(qk, cos, sin)
        q, k = qk[:, :h].to(x.dtype), qk[:, h:].to(x.dtype)
        v = qkv[:, 2 * h * hd:].view(n, h, hd)
        if windows is None:  # [1, H, N, hd]: 3-D inputs take torch's slow math path on the CPU
            out = functional.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                v.transpose(0, 1)[None])[0].transpose(0, 1)
        else:
            out = windows.unbatch(functional.scaled_dot_product_attention(
                windows.batch(q), windows.batch(k), windows.batch(v), attn_mask=windows.mask))
        projected: torch.Tensor = self.proj(out.reshape(n, h * hd))
        return projected


class VisionMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate and up stay apart, as the checkpoint stores them."""

    def __init__(self, cfg: QwenViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        d, inter = cfg.hidden_size, cfg.intermediate_size
        self.act: Activation = QWEN_ACTS[cfg.hidden_act]
        self.gate_proj = Linear(d, inter, True, dtype, device)
        self.up_proj = Linear(d, inter, True, dtype, device)
        self.down_proj = Linear(inter, d, True, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return out


class VisionBlock(nn.Module):
    """Pre-norm (RMSNorm): x + attn(norm1(x)), then + mlp(norm2(...))."""

    def __init__(self, cfg: QwenViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, NORM_EPS, dtype, device)
        self.norm2 = RMSNorm(cfg.hidden_size, NORM_EPS, dtype, device)
        self.attn = VisionAttention(cfg, dtype, device)
        self.mlp = VisionMLP(cfg, dtype, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                windows: Windows | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, windows)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class PatchMerger(nn.Module):
    """Each merge group's patches, normed and side by side [merge^2 * D], through two linear
    layers with an exact GELU between, to the text model's width."""

    def __init__(self, cfg: QwenViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.width = d * cfg.spatial_merge_size ** 2
        self.ln_q = RMSNorm(d, NORM_EPS, dtype, device)
        # a Sequential, for the checkpoint's names mlp.0 and mlp.2
        self.mlp = nn.Sequential(Linear(self.width, self.width, True, dtype, device), nn.GELU(),
                                 Linear(self.width, cfg.out_hidden_size, True, dtype, device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, D] -> [N / merge^2, out]."""
        out: torch.Tensor = self.mlp(self.ln_q(x).view(-1, self.width))
        return out


class QwenVisionTower(nn.Module):
    """One image's patches [rows * cols, C * T * P * P] -> its merged rows
    [rows * cols / merge^2, out_hidden_size], in the image's order of merge groups."""

    def __init__(self, cfg: QwenViTConfig, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg, dtype, device)
        self.blocks = nn.ModuleList(VisionBlock(cfg, dtype, device) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, dtype, device)

    def rotary(self, rows: int, cols: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_signed) [rows * cols, 1, head_dim] float32 in merge-group order: a
        patch's row rotates the first of each half of the dims, its column the second."""
        m = self.cfg.spatial_merge_size
        r = torch.arange(rows, device=device)[:, None].expand(rows, cols)
        c = torch.arange(cols, device=device)[None, :].expand(rows, cols)

        def grouped(pos: torch.Tensor) -> torch.Tensor:
            return pos.reshape(rows // m, m, cols // m, m).transpose(1, 2).reshape(-1)

        # rows and columns rotate a quarter of each head's dims each (half the pairs); made
        # here, not kept as a buffer: a model built on the meta device loads no such tensor
        quarter = self.cfg.head_dim // 2
        even = torch.arange(0, quarter, 2, dtype=torch.float32, device=device)
        inv = 1.0 / (self.cfg.rope_theta ** (even / quarter))
        freqs = torch.cat((grouped(r).float()[:, None] * inv,
                           grouped(c).float()[:, None] * inv), dim=-1)  # [N, head_dim / 2]
        cos, sin = freqs.cos(), freqs.sin()
        # the sign of rotate_half folded into sin (layers.rotary's convention)
        return torch.cat((cos, cos), -1)[:, None], torch.cat((-sin, sin), -1)[:, None]

    def forward(self, patches: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return run_through(self.steps(patches, grid))

    def steps(self, patches: torch.Tensor, grid: tuple[int, int]) -> EncoderSteps:
        rows, cols = grid
        cfg, device = self.cfg, patches.device
        n, unit = rows * cols, cfg.spatial_merge_size ** 2
        if patches.shape[0] != n:
            raise ValueError(f"{patches.shape[0]} patches for a grid of {rows} x {cols}")
        order, lengths = window_order(rows, cols, cfg.spatial_merge_size, cfg.window_groups,
                                      device)

        def windowed(t: torch.Tensor) -> torch.Tensor:  # whole merge groups, in window order
            return t.reshape(n // unit, unit, *t.shape[1:])[order].reshape(t.shape)

        cos, sin = self.rotary(rows, cols, device)
        cos, sin = windowed(cos), windowed(sin)
        x = windowed(self.patch_embed(patches))  # [N, D]
        windows = Windows(lengths, device)
        full = set(cfg.fullatt_block_indexes)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, None if i in full else windows)
            yield
        merged: torch.Tensor = self.merger(x)  # [groups, out], in window order
        return merged[torch.argsort(order)]

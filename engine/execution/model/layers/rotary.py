"""Rotary position embedding: inverse frequencies per rope type, cos/sin per round, rotation."""
from __future__ import annotations

import math

import torch
from torch import nn

from engine.execution.model.config import ROPE_TYPES, RopeSpec
from engine.kernels import ops


def rope_inv_freq(head_dim: int, spec: RopeSpec) -> torch.Tensor:
    """Inverse frequencies for `spec` (rope_type in ROPE_TYPES), as Hugging Face computes
    them."""
    kind, rope, theta = spec.kind, spec.params, spec.theta
    even = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
    inv = 1.0 / (theta ** (even / head_dim))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rope["factor"])
    if kind == "longrope":  # the short factors (RotaryEmbedding switches to the long ones)
        return inv / torch.tensor(rope["short_factor"], dtype=torch.float32, device="cpu")
    if kind == "llama3":
        factor = float(rope["factor"])
        low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old_ctx = float(rope["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_type {kind!r} is not supported (supported: {ROPE_TYPES})")


class RotaryEmbedding(nn.Module):
    """cos/sin of the round's positions, computed once per round (not per layer) in fp32 as
    HF does; no table, since one for 128k positions would take 100+ MB.

    HF rotates with `x*cos + rotate_half(x)*sin`, rotate_half(x) = cat(-x2, x1). We fold the
    sign into sin (cat(-s, s)) so that rotate_half becomes a plain roll:
    x*cos + roll(x, d/2) * sin_signed, i.e. three ops.
    """

    inv_freq: torch.Tensor  # a non-persistent buffer (register_buffer)
    long_inv_freq: torch.Tensor  # LongRoPE only

    def __init__(self, head_dim: int, max_positions: int, spec: RopeSpec,
                 device: torch.device | str | None = None,
                 factors: torch.Tensor | None = None) -> None:
        """`factors`: llama.cpp's per-frequency divisors (a Llama 3 GGUF's rope_freqs)."""
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.spec = spec
        inv = rope_inv_freq(head_dim, spec)
        if factors is not None:
            if factors.shape != inv.shape:
                raise ValueError(f"{factors.numel()} rope factors, expected {inv.numel()}")
            inv = inv / factors.to(inv.dtype)
        self.register_buffer("inv_freq", inv.to(device), persistent=False)
        # LongRoPE (Phi-3): positions from `switch` on rotate by the long factors, and cos/sin
        # are scaled by `attention_factor`
        self.switch: int | None = None
        self.attention_factor = 1.0
        # M-RoPE (Qwen2-VL): frequency j rotates by position component sections[j] of
        # (time, row, column); positions come as [3, T]
        self.sections: torch.Tensor | None
        self.register_buffer("sections", None, persistent=False)
        if spec.params.get("mrope_section"):
            parts = [int(n) for n in spec.params["mrope_section"]]
            if sum(parts) != head_dim // 2:
                raise ValueError(f"mrope_section {parts} does not cover {head_dim // 2} "
                                 "frequencies")
            which = [i % 3 for i, n in enumerate(parts) for _ in range(n)]
            self.register_buffer("sections", torch.tensor(which, dtype=torch.int64,
                                                          device=device), persistent=False)
        if spec.kind == "longrope":
            params = spec.params
            base = rope_inv_freq(head_dim, RopeSpec(spec.theta))
            long = base / torch.tensor(params["long_factor"], dtype=torch.float32,
                                       device="cpu")
            self.register_buffer("long_inv_freq", long.to(device), persistent=False)
            self.switch = int(params["original_max_position_embeddings"])
            factor = float(params["factor"])
            self.attention_factor = float(params.get("attention_factor") or (
                1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(self.switch))))

    def forward(self, positions: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions ([3, T] for M-RoPE) -> (cos, sin_signed), each [T, 1, head_dim]
        in `dtype`.

        Reading a device tensor's values waits for the device, so positions are checked
        against the model's range here only on the CPU (free there); the executor checks the
        round's positions on the host before it packs them, on every device."""
        host = positions.device.type == "cpu"
        top = int(positions.max()) if host and positions.numel() else -1
        if top >= self.max_positions:
            raise ValueError(f"position {top} beyond the model's {self.max_positions} positions")
        inv = self.inv_freq[None, :]
        if self.switch is not None and (not host or top >= self.switch):
            inv = torch.where(positions[:, None] >= self.switch, self.long_inv_freq[None, :], inv)
        if positions.dim() == 2:  # M-RoPE: [3, T] -> each frequency's own component
            if self.sections is None:
                raise ValueError("positions in three components for a one-dimensional rope")
            freqs = (positions.float()[:, :, None] * inv).gather(
                0, self.sections.expand(1, positions.shape[1], -1)).squeeze(0)
        else:
            freqs = positions.float()[:, None] * inv
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        cos = torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(1)
        sin = torch.cat((-sin, sin), dim=-1).to(dtype).unsqueeze(1)
        return cos, sin


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate x [T, heads, head_dim] in place (x may be a view into wider token rows, with
    heads and head_dim contiguous); cos/sin from RotaryEmbedding."""
    if ops.usable(x):
        ops.rotary(x, cos, sin)
    else:  # both operands of addcmul are temporaries, so writing into x is safe
        torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), sin, out=x)

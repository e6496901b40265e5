"""A GGUF weight kept in its blocks on the device: one part, or the parts of a fused
projection (qkv, gate_up) stacked by rows, each in its own block type.

Importing this module needs no Triton (the layer code checks for these weights on every
path); the kernels are imported when a product first runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.kernels.gpu_quant import layouts

if TYPE_CHECKING:
    from engine.kernels.quant import QuantWeight


@dataclass(frozen=True, slots=True)
class DeviceBlocks:
    """One GGUF tensor's bytes, uint8 [out_features, row_bytes] in ggml's layout."""

    qtype: int
    data: torch.Tensor
    in_features: int
    out_features: int

    def __post_init__(self) -> None:
        if not layouts.supported(self.qtype):
            raise ValueError(f"block type {self.qtype} has no device kernel")
        rb = layouts.row_bytes(self.qtype, self.in_features)
        d = self.data
        if d.dtype != torch.uint8 or not d.is_contiguous() \
                or tuple(d.shape) != (self.out_features, rb):
            raise ValueError(f"{layouts.name(self.qtype)} weight [{self.out_features}, "
                             f"{self.in_features}] needs contiguous uint8 "
                             f"[{self.out_features}, {rb}], got {d.dtype} {list(d.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()


@dataclass(frozen=True, slots=True)
class DeviceQuantWeight:
    """Parts stacked by rows (in order); x @ W^T writes each part's columns."""

    parts: tuple[DeviceBlocks, ...]

    def __post_init__(self) -> None:
        if not self.parts or len({p.in_features for p in self.parts}) != 1 \
                or len({p.data.device for p in self.parts}) != 1:
            raise ValueError("a device weight needs parts of one width on one device")

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def device(self) -> torch.device:
        return self.parts[0].data.device

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(layouts.name(p.qtype) for p in self.parts)


def to_device(parts: Sequence[QuantWeight], device: torch.device | str) -> DeviceQuantWeight:
    """The host blocks (maybe views of a memory-mapped file) copied to `device` as they are."""
    return DeviceQuantWeight(tuple(
        DeviceBlocks(p.qtype, p.data.to(device=device).contiguous(), p.in_features,
                     p.out_features) for p in parts))

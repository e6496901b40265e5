"""How many bytes a loaded model's weights take where they sit: what sizing the KV pool and
the several-models budget must count for the weights.

A GGUF kept in its blocks (on the host, or on a GPU through engine.kernels.gpu_quant) counts
its blocks; a dequantised one its float tensors (3-4x its file on a GPU in bf16). Shared
storage (a tied LM head, a view) counts once; oneDNN-packed copies count as what they hold.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.model.linear_kernels import SplitWeight
from engine.kernels.gpu_quant import DeviceQuantWeight
from engine.kernels.quant import QuantWeight


def _tensors(weight: object) -> list[torch.Tensor]:
    """The tensors behind a Linear's or an Embedding's weight."""
    if isinstance(weight, torch.Tensor):
        return [weight]
    if isinstance(weight, SplitWeight | DeviceQuantWeight):
        return [p.data for p in weight.parts]
    return [weight.data] if isinstance(weight, QuantWeight) else []


def _key(t: torch.Tensor) -> tuple[int, int]:
    if t.is_mkldnn:  # opaque: no storage pointer to share
        return id(t), 0
    return t.untyped_storage().data_ptr(), int(t.storage_offset())


def weight_bytes(model: nn.Module, device: torch.device | str | None = None) -> int:
    """Bytes of the model's parameters, buffers and block weights (on `device` only, where
    given: e.g. "cuda", not the host copies a GPU model keeps none of)."""
    want = None if device is None else torch.device(device).type
    seen: set[tuple[int, int]] = set()
    total = 0
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        w = module.__dict__.get("weight")  # plain attributes: packed or block weights
        if w is not None and not isinstance(w, nn.Parameter):
            tensors += _tensors(w)
    for t in tensors:
        if want is not None and t.device.type != want:
            continue
        key = _key(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total

"""Host-built index arrays on their way to the device.

A round's index arrays (token ids, positions, KV slots, CSR page tables) are built in
Python on the host. `torch.tensor(list, device="cuda")` copies from pageable memory and waits
for it; built in pinned memory they go over asynchronously, behind the work already queued.
"""
from __future__ import annotations

import torch


def host_tensor(values: list[int], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """`values` as a CPU tensor, in pinned (page-locked) memory when `pin`."""
    out = torch.tensor(values, dtype=dtype, device="cpu")
    return out.pin_memory() if pin else out


def to_device(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` on `device`: built there directly on the CPU, through pinned memory and a
    copy that does not wait elsewhere."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype, device="cpu")
    return host_tensor(values, dtype, pin=True).to(device, non_blocking=True)

"""The gated MLP's activations: act(gate) * up over rows [gate | up]."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.kernels import ops


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, computed in place in the gate half (gate_up is a temporary)."""
    if ops.usable(gate_up):
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate, inplace=True).mul_(up)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up (Gemma), in the gate half."""
    if ops.usable(gate_up):
        return ops.gelu_tanh_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh").mul_(up)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}

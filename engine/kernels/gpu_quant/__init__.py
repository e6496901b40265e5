"""GGUF weights kept in their blocks on a GPU, multiplied by Triton kernels that dequantize
tiles in registers (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K): a model takes about its file's
size in device memory instead of 3-4x that as bf16.

layouts.py: the block layouts; decode.py: the Triton decoders per type; matmul_kernel.py and
rows_kernel.py: the product and the embedding lookup; launch.py: tile choice and launches;
weight.py: the device weight. Triton's interpreter (TRITON_INTERPRET=1) runs the same kernels
on CPU tensors, which is how the tests check them against gguf-py's dequantisation.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

import torch

from engine.kernels.gpu_quant.layouts import supported
from engine.kernels.gpu_quant.weight import DeviceBlocks, DeviceQuantWeight, to_device

__all__ = ["DeviceBlocks", "DeviceQuantWeight", "dequantize_rows", "matmul", "self_test",
           "supported", "to_device", "unusable_reason"]


def interpreted() -> bool:
    """Triton runs its kernels in its interpreter, on CPU tensors (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def unusable_reason(device: torch.device | str) -> str | None:
    """Why weights on `device` cannot stay in their blocks (None: they can): Triton missing,
    or a device its kernels do not run on (a CPU, unless under the interpreter)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    kind = torch.device(device).type
    if kind == "cuda" or (kind == "cpu" and interpreted()):
        return None
    return f"Triton's kernels do not run on {kind}"


def self_test(device: torch.device | str, dtype: torch.dtype,
              qtypes: Iterable[int]) -> str | None:
    """Why the kernels for these block types cannot be trusted on `device` with `dtype`
    activations (None: each multiplied a small weight right there, against gguf-py)."""
    from engine.kernels.gpu_quant.probe import failure

    wanted = frozenset(q for q in qtypes if supported(q))
    return failure(torch.device(device), dtype, wanted) if wanted else None


def matmul(x: torch.Tensor, weight: DeviceQuantWeight,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ W^T (+ bias) in x's dtype, W dequantized tile by tile in the kernel."""
    from engine.kernels.gpu_quant import launch

    return launch.matmul(x, weight, bias)


def dequantize_rows(weight: DeviceQuantWeight, ids: torch.Tensor,
                    dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of a one-part weight (an embedding table) as floats in `dtype`."""
    from engine.kernels.gpu_quant import launch

    return launch.dequantize_rows(weight, ids, dtype)

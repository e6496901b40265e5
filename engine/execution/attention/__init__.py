"""Attention backends by name. Imported lazily: the CUDA-only one loads flashinfer on use."""
from __future__ import annotations

import importlib
import importlib.util

import torch

from engine.execution.attention.base import AttentionBackend, AttentionInputs

BACKENDS: dict[str, str] = {
    "torch": "engine.execution.attention.torch_backend:TorchAttention",
    "flashinfer": "engine.execution.attention.flashinfer_backend:FlashInferAttention",
}


def get_backend(name: str) -> type[AttentionBackend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} (known: {', '.join(BACKENDS)})")
    module, cls = BACKENDS[name].split(":")
    backend: type[AttentionBackend] = getattr(importlib.import_module(module), cls)
    return backend


def default_backend(device: torch.device | str, dtype: torch.dtype,
                    sliding: bool = False) -> str:
    """flashinfer on CUDA in half precision when it is installed (and the model has no
    sliding-window layers), else the torch reference."""
    if (not sliding and torch.device(device).type == "cuda"
            and dtype in (torch.float16, torch.bfloat16)
            and importlib.util.find_spec("flashinfer")):
        return "flashinfer"
    return "torch"


__all__ = ["BACKENDS", "AttentionBackend", "AttentionInputs", "default_backend", "get_backend"]

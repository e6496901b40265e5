"""Attention backends by name. Imported lazily: the CUDA-only one loads flashinfer on use;
which one a model runs with is decided in `choice`."""
from __future__ import annotations

import importlib

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


__all__ = ["BACKENDS", "AttentionBackend", "AttentionInputs", "get_backend"]

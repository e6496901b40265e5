"""What a loaded model costs on its device, and how much KV fits beside it.

`weight_bytes` counts the weights as they sit in memory (a GGUF dequantized to bfloat16 costs
3-4x its file; quantized blocks cost their blocks), each storage once (tied embeddings, the
MoE's stacked experts and their views). On CUDA the KV pool is fitted to the device's free
memory (`torch.cuda.mem_get_info`) after the weights, less a reserve for activations and
attention workspaces: a `kv_tokens` that does not fit is lowered, with a warning, instead of
failing the first long prompt with out-of-memory.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import torch
from torch import nn

log = logging.getLogger(__name__)

RESERVE_MIN = 1 << 30  # bytes kept free on a GPU for activations, logits and workspaces
RESERVE_FRACTION = 0.08  # ... or this share of the device, if more


def _tensors(value: object, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors held by a weight: itself, or a quantized weight's fields (dataclasses,
    tuples of parts), whatever class holds them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name), depth + 1)
    elif depth < 3 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item, depth + 1)


def weight_bytes(model: nn.Module, device: torch.device | str | None = None) -> int:
    """Bytes of `model`'s weights in memory (on `device` only, where given): parameters,
    buffers and weights kept as plain attributes (packed or quantized), each storage once."""
    want = None if device is None else torch.device(device)
    seen: set[tuple[str, int]] = set()
    total = 0
    for module in model.modules():
        held = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        held += [t for v in vars(module).values() if not isinstance(v, (nn.Module, dict))
                 for t in _tensors(v)]
        for t in held:
            if t.device.type == "meta" or (want is not None and t.device.type != want.type):
                continue
            if t.is_mkldnn:  # a oneDNN-packed copy: opaque, no storage to share
                key, size = ("mkldnn", id(t)), t.numel() * t.element_size()
            else:
                storage = t.untyped_storage()
                key, size = (str(t.device), storage.data_ptr()), storage.nbytes()
            if key not in seen:
                seen.add(key)
                total += size
    return total


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device; None elsewhere."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def reserve(total: int) -> int:
    return max(RESERVE_MIN, int(total * RESERVE_FRACTION))


def fit_kv_tokens(wanted: int, page_size: int, bytes_per_token: int, free: int, total: int,
                  other: int = 0) -> int:
    """The KV positions to allocate: `wanted`, or fewer (whole pages) where the device's
    free memory less the reserve and `other` bytes (the local layers' pool) holds fewer."""
    room = free - reserve(total) - other
    fits = max(0, room) // bytes_per_token // page_size * page_size
    if fits < page_size:
        raise ValueError(f"no room for the KV cache: {free / 2**30:.1f} GiB free on the GPU "
                         f"after the weights, {reserve(total) / 2**30:.1f} GiB kept for "
                         "activations; use a smaller model or free the GPU")
    if fits < wanted:
        log.warning("kv_tokens %d does not fit beside the weights (%.1f GiB free): %d "
                    "allocated", wanted, free / 2**30, fits)
    return min(wanted, fits)


def gpu_room(device: str, loaded: int) -> int | None:
    """On a GPU, the bytes models may hold there (the several-models budget): what is
    loaded and what is free, less the reserve; None elsewhere (the machine's memory)."""
    memory = device_memory(torch.device(device))
    return None if memory is None else max(1, loaded + memory[0] - reserve(memory[1]))

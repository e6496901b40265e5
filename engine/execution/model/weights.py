"""The one weight-loading loop: a checkpoint's tensors into a model built on the meta device.

Both loaders use it, a safetensors folder (`SafetensorsSource`, here) and a GGUF file
(gguf_loader.GGUFSource, in its own blocks or dequantised), so that both agree on what a
checkpoint must hold: every tensor the model's parameters need (CausalLM.checkpoint_keys,
through the architecture's `packed_modules` name map), and nothing else except what the
architecture skips (`skip_key`). A source gives each parameter its tensor: the row-stack of
a fused projection's pieces as one float tensor, quantized blocks (quant.QuantWeight) or a
linear_kernels.SplitWeight; vectors (norms, biases) as float tensors.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from engine.execution.errors import ModelFileError
from engine.execution.model.layers import Embedding, Linear

if TYPE_CHECKING:
    from engine.execution.model.decoder import CausalLM
    from engine.execution.model.linear_kernels import Weight

log = logging.getLogger(__name__)


class WeightSource(Protocol):
    where: str  # the file or folder, for messages

    def keys(self) -> list[str]:
        """Hugging Face keys of every tensor it holds."""

    def matrix(self, keys: list[str], dtype: torch.dtype, device: torch.device | str) -> Weight:
        """The row-stack of these 2-D tensors: float in `dtype` on `device`, or blocks."""

    def vector(self, keys: list[str], dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor:
        """These tensors concatenated, as floats in `dtype` on `device`."""


def load_weights(model: CausalLM, source: WeightSource, device: torch.device | str,
                 rope_factors: torch.Tensor | None = None) -> CausalLM:
    """Fill every parameter of `model` (built on meta) from `source`; the rotary modules
    are rebuilt on `device`, with llama.cpp's `rope_factors` where a GGUF has them."""
    wanted = model.checkpoint_keys()
    present = set(source.keys())
    needed = {k for keys in wanted.values() for k in keys}
    unknown = sorted(k for k in present - needed if not model.skip_key(k))
    if unknown:
        raise ModelFileError(f"{source.where}: tensor {unknown[0]} has no place in a "
                             f"{model.config.model_type} model ({len(unknown)} such tensors)")
    missing = sorted(needed - present)
    if missing:
        raise ModelFileError(f"checkpoint {source.where} lacks {len(missing)} tensors, "
                             f"e.g. {missing[:3]}")
    dtype = model.dtype
    for (name, attr), keys in wanted.items():
        module = model.get_submodule(name)
        want = tuple(getattr(module, attr).shape)
        if attr == "weight" and isinstance(module, (Linear, Embedding)):
            _set_matrix(module, source.matrix(keys, dtype, device), want, keys, source.where)
        else:
            value = source.vector(keys, dtype, device)
            _check(tuple(value.shape), want, keys, source.where)
            setattr(module, attr, nn.Parameter(value, requires_grad=False))
    if model.config.tie_word_embeddings:
        head, table = model.lm_head, model.model.embed_tokens.weight
        if isinstance(table, torch.Tensor):
            head.weight = table
        else:
            head.set_quantized(table)
    try:
        model.build_rotary(device, rope_factors)
    except ValueError as exc:
        raise ModelFileError(f"{source.where}: tensor rope_freqs.weight: {exc}") from exc
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ModelFileError(f"{source.where}: nothing loaded for {', '.join(left[:3])}")
    return model.eval()


def _check(got: tuple[int, ...], want: tuple[int, ...], keys: list[str], where: str) -> None:
    if got != want:
        raise ModelFileError(f"{where}: {', '.join(keys)} has shape {list(got)}, "
                             f"the model's config implies {list(want)}")


def _set_matrix(module: Linear | Embedding, weight: Weight, want: tuple[int, ...],
                keys: list[str], where: str) -> None:
    if isinstance(weight, torch.Tensor):
        _check(tuple(weight.shape), want, keys, where)
        module.weight = nn.Parameter(weight, requires_grad=False)
        return
    _check((weight.out_features, weight.in_features), want, keys, where)
    if isinstance(module, Embedding):
        from engine.kernels.gpu_quant import DeviceQuantWeight
        from engine.kernels.quant import QuantWeight

        if (isinstance(weight, DeviceQuantWeight) and len(weight.parts) == 1) \
                or isinstance(weight, QuantWeight):
            module.set_quantized(weight)
        else:
            raise ModelFileError(f"{where}: {keys[0]} must be one tensor")
    else:
        module.set_quantized(weight)


class SafetensorsSource:
    """A Hugging Face folder's *.safetensors, each tensor passed through the
    architecture's `adapt_hf_tensor`."""

    def __init__(self, path: Path, model: CausalLM) -> None:
        from safetensors import safe_open

        self.where = str(path)
        self._model = model
        self._files: list[Any] = []
        self._where: dict[str, Any] = {}
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelFileError(f"no *.safetensors in {path}")
        for file in files:
            handle = safe_open(str(file), framework="pt", device="cpu")
            self._files.append(handle)
            for key in handle.keys():  # type: ignore[no-untyped-call]  # noqa: SIM118
                self._where[model.hf_key(key)] = (handle, key)

    def keys(self) -> list[str]:
        return list(self._where)

    def _get(self, key: str, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        handle, stored = self._where[key]
        tensor = handle.get_tensor(stored)
        return self._model.adapt_hf_tensor(key, tensor).to(device=device, dtype=dtype)

    def rows(self, key: str, indices: list[int], dtype: torch.dtype,
             device: torch.device | str) -> torch.Tensor:
        """Some rows of a matrix stored as it is used (no `adapt_hf_tensor`), read alone:
        two rows of a vocabulary-wide head without reading the head."""
        handle, stored = self._where[key]
        whole = handle.get_slice(stored)
        return torch.cat([whole[i:i + 1] for i in indices]).to(device=device, dtype=dtype)

    def matrix(self, keys: list[str], dtype: torch.dtype, device: torch.device | str) -> Weight:
        parts = [self._get(k, dtype, device) for k in keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def vector(self, keys: list[str], dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor:
        parts = [self._get(k, dtype, device) for k in keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

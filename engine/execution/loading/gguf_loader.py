"""A GGUF file into its architecture's model: in its own block format (on the host or on a
GPU), or dequantised to floats.

All go through the one weight loop (model/weights.py) with a `GGUFSource`:

* quantized: every quantized tensor is kept as a quant.QuantWeight, a view into the file's
  memory map where the bytes are used as stored, fresh memory read from the file where they
  must be reordered (attn_q / attn_k rows, see gguf_file) or stacked (a fused qkv or gate_up
  whose parts share a block type; parts of different types become a SplitWeight). No float
  copy of a quantized weight is ever made. Vectors become float32 tensors; a float32 matrix
  stays a float tensor (packed for oneDNN later).
* on the device (a GPU): the quantized path's blocks copied to the device as they are
  (gpu_quant.DeviceQuantWeight, the parts of a fused projection in one), for the block types
  its kernels multiply; a matrix of any other type (F16, Q5_1, Q3_K...) dequantised to the
  model's dtype. Vectors in the model's dtype.
* dequantised, the float reference path: every tensor dequantised in memory, in HF layout.

A vision model's projector file (its image tower) runs float: F16 matrices stay float16 on
the CPU, widened product by product. Where the text model runs in its blocks on the CPU, the
tower's matrices may too (`tower`, the projector quantization: mmproj_quantize): a projector
file's own blocks as they are, its float matrices quantized to Q8_0 once at load, so that the
tower's products take int8 activations as the text model's do.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.execution.errors import ModelFileError
from engine.execution.loading.gguf_file import GGUFFile, GGUFTensor
from engine.execution.model.decoder import CausalLM
from engine.execution.model.linear_kernels import SplitWeight, quantized
from engine.execution.model.weights import load_weights

if TYPE_CHECKING:
    from engine.execution.model.linear_kernels import Weight
    from engine.kernels.quant import QuantWeight

log = logging.getLogger(__name__)

F32, F16, BF16 = 0, 1, 30


# --- the quantized path ----------------------------------------------------------------------

def _float(file: GGUFFile, t: GGUFTensor) -> torch.Tensor:
    """A float tensor (F32 / F16 / BF16) as float32, rows in HF order."""
    data = np.asarray(t.data)
    if t.qtype == BF16:
        out = torch.from_numpy(data.view(np.uint8).copy()).view(torch.bfloat16).float()
    else:
        out = torch.from_numpy(data.astype(np.float32))
    out = out.reshape(t.shape)
    rows = t.hf_rows()
    return out if rows is None else out.index_select(0, rows)


def _blocks(file: GGUFFile, t: GGUFTensor) -> torch.Tensor:
    """uint8 [out, row_bytes]: a view into the map, or reordered rows in fresh memory."""
    from engine.kernels import quant

    try:
        width = quant.row_bytes(t.qtype, t.shape[1])
    except ValueError as exc:
        raise ModelFileError(f"{file.path}: tensor {t.name}: {exc}") from exc
    rows = t.hf_rows()
    if rows is None:
        return torch.from_numpy(np.asarray(t.data).view(np.uint8).reshape(t.shape[0], width))
    return torch.from_numpy(file.read(t).reshape(t.shape[0], width)[rows.numpy()])


def _quant_weight(file: GGUFFile, t: GGUFTensor) -> QuantWeight:
    from engine.kernels import quant

    if not quant.supported(t.qtype):
        raise ModelFileError(f"{file.path}: tensor {t.name} is in block type "
                             f"{_type_name(t.qtype)}, which Ferry's kernels do not multiply")
    return quant.QuantWeight(t.qtype, _blocks(file, t), t.shape[1], t.shape[0])


def _type_name(qtype: int) -> str:
    import gguf

    return gguf.GGMLQuantizationType(qtype).name


def _stacked(file: GGUFFile, parts: list[GGUFTensor]) -> QuantWeight:
    """One QuantWeight with the parts' rows stacked (parts of one block type), read into
    fresh memory part by part."""
    from engine.kernels import quant

    qtype, n_in = parts[0].qtype, parts[0].shape[1]
    width = quant.row_bytes(qtype, n_in)
    data = [file.read(p).reshape(p.shape[0], width) for p in parts]
    rows = [p.hf_rows() for p in parts]
    out = np.concatenate([d if r is None else d[r.numpy()] for d, r in zip(data, rows)])
    return quant.QuantWeight(qtype, torch.from_numpy(out), n_in, out.shape[0])


def _half(parts: list[GGUFTensor]) -> torch.Tensor:
    """A projector's F16 matrix as float16 (linear_kernels widens it product by product): a
    view into the map for one part, joined parts in fresh memory."""
    halves = [torch.from_numpy(np.asarray(p.data).reshape(p.shape)) for p in parts]
    return halves[0] if len(halves) == 1 else torch.cat(halves)


def _dequantized(t: GGUFTensor) -> torch.Tensor:
    """float32 in HF layout; quantized blocks through quant.dequantize (exact)."""
    from engine.kernels import quant

    if t.qtype in (F32, F16, BF16):
        data = np.asarray(t.data)
        out = (torch.from_numpy(data.view(np.uint8).copy()).view(torch.bfloat16).float()
               if t.qtype == BF16 else torch.from_numpy(data.astype(np.float32)))
        out = out.reshape(t.shape)
    else:
        blocks = torch.from_numpy(np.asarray(t.data).view(np.uint8).reshape(t.shape[0], -1))
        out = quant.dequantize(quant.QuantWeight(t.qtype, blocks, t.shape[1], t.shape[0]))
    rows = t.hf_rows()
    return out if rows is None else out.index_select(0, rows)


class GGUFSource:
    """A GGUFFile's tensors for the weight loop, in their own blocks (`quantized`; on the
    device where `device_blocks`) or dequantised to floats."""

    def __init__(self, file: GGUFFile, quantized: bool, device_blocks: bool = False,
                 tower: int | None = None) -> None:
        self.file = file
        self.where = str(file.path)
        self.quantized = quantized
        self.device_blocks = device_blocks
        self.tower = tower  # the block type the image tower's float matrices take (host)
        self._projector_maps: list[tuple[int, int]] | None = None

    def keys(self) -> list[str]:
        return list(self.file.tensors)

    def matrix(self, keys: list[str], dtype: torch.dtype, device: torch.device | str) -> Weight:
        file = self.file
        parts = [file.tensors[k] for k in keys]
        kinds = {p.qtype for p in parts}
        if any(p.projector for p in parts):  # the image tower
            if self.tower is not None and torch.device(device).type == "cpu":
                return self._tower_matrix(parts, self.tower)
            if {p.qtype for p in parts} == {F16} and dtype == torch.float32 \
                    and torch.device(device).type == "cpu":
                return _half(parts)
            return torch.cat([_dequantized(p) for p in parts]).to(device=device, dtype=dtype)
        if self.device_blocks:
            return self._device_matrix(parts, dtype, device)
        if not self.quantized or kinds == {F32}:  # float32 matrices stay float
            return torch.cat([_dequantized(p) if not self.quantized else _float(file, p)
                              for p in parts]).to(device=device, dtype=dtype)
        if len(parts) == 1:
            return _quant_weight(file, parts[0])
        if len(kinds) == 1:
            _quant_weight(file, parts[0])  # the type check, with the tensor's name
            return _stacked(file, parts)
        return SplitWeight(tuple(_quant_weight(file, p) for p in parts))

    def _tower_matrix(self, parts: list[GGUFTensor], qtype: int) -> Weight:
        """An image tower's matrix in blocks: the projector file's own where it stores them
        in a type the kernels multiply, else its floats quantized to `qtype`."""
        from engine.kernels import quant

        kinds = {p.qtype for p in parts}
        if len(kinds) == 1 and not kinds & {F32, F16, BF16} and quant.supported(parts[0].qtype):
            file = self.file
            return _quant_weight(file, parts[0]) if len(parts) == 1 else _stacked(file, parts)
        floats = _half(parts) if kinds == {F16} else torch.cat([_dequantized(p) for p in parts])
        weight = quantized(floats, qtype)
        self._release(parts)
        return weight

    def _release(self, parts: list[GGUFTensor]) -> None:
        """The projector file's pages of `parts`, read and now held as blocks: dropped at
        once, so that loading never holds the tower twice."""
        from engine.execution.residency import mapped, release_file_range

        projector = self.file.projector
        if projector is None:
            return
        if self._projector_maps is None:
            self._projector_maps = mapped(str(projector.path))[0]
        for p in parts:
            data = np.asarray(p.data)
            release_file_range(self._projector_maps, data.ctypes.data, data.nbytes)

    def _device_matrix(self, parts: list[GGUFTensor], dtype: torch.dtype,
                       device: torch.device | str) -> Weight:
        from engine.kernels import gpu_quant

        file = self.file
        if not all(gpu_quant.supported(p.qtype) for p in parts):
            return torch.cat([_dequantized(p) for p in parts]).to(device=device, dtype=dtype)
        if len(parts) == 1:
            return gpu_quant.to_device([_quant_weight(file, parts[0])], device)
        if len({p.qtype for p in parts}) == 1:  # one launch for the stacked rows
            return gpu_quant.to_device([_stacked(file, parts)], device)
        return gpu_quant.to_device([_quant_weight(file, p) for p in parts], device)

    def vector(self, keys: list[str], dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor:
        parts = [self.file.tensors[k] for k in keys]
        return torch.cat([_dequantized(p) if p.projector else _float(self.file, p)
                          for p in parts]).to(device=device, dtype=dtype)


def _load(file: GGUFFile, quantized: bool, dtype: torch.dtype, device: torch.device | str,
          device_blocks: bool = False, tower: int | None = None) -> CausalLM:
    model = file.architecture(file.config, dtype, "meta")  # no float storage at all
    load_weights(model, GGUFSource(file, quantized, device_blocks, tower), device,
                 file.rope_factors)
    model.eos_ids = file.eos_ids
    return model


def load_quantized(file: GGUFFile, tower: int | None = None) -> CausalLM:
    """The model with float32 activations over the file's own blocks (CPU); a vision
    model's tower in blocks too where `tower` (the block type its float matrices take)."""
    return _load(file, True, torch.float32, "cpu", tower=tower)


def load_device_blocks(file: GGUFFile, dtype: torch.dtype,
                       device: torch.device | str) -> CausalLM:
    """The model in float `dtype` on `device` (a GPU; a CPU under Triton's interpreter) with
    the file's blocks kept as they are in device memory (engine.kernels.gpu_quant)."""
    return _load(file, True, dtype, device, device_blocks=True)


def load_dequantized(file: GGUFFile, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """The model in float `dtype` on the file's weights dequantised in memory."""
    return _load(file, False, dtype, device)

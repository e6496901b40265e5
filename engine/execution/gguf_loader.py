"""A GGUF file into our LlamaForCausalLM: in its own block format, or dequantised to floats.

`load_quantized` keeps every quantized tensor as a quant.QuantWeight: a view into the file's
memory map where the bytes are used as stored, fresh memory read from the file where they must
be reordered (attn_q / attn_k rows, see gguf_file) or stacked (a fused qkv or gate_up whose
parts share a block type). No float copy of a quantized weight is ever made. Norms and other
vectors become float32 tensors; a float32 matrix stays a float tensor (packed for oneDNN later).

`load_dequantized` is the float reference path: every tensor dequantised in memory, in HF
layout, loaded like a safetensors checkpoint.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from engine.execution.errors import ModelFileError
from engine.execution.gguf_file import GGUFFile, GGUFTensor
from engine.execution.model.layers import Linear, RotaryEmbedding, default_weight_loader
from engine.execution.model.linear_kernels import SplitWeight
from engine.execution.model.llama import DecoderLayer, LlamaForCausalLM

if TYPE_CHECKING:
    from engine.kernels.quant import QuantWeight

log = logging.getLogger(__name__)

F32, F16, BF16 = 0, 1, 30


def _rotary(model: LlamaForCausalLM, file: GGUFFile, device: torch.device | str) -> None:
    """A fresh rotary module on `device` (the model may have been built on meta), with
    llama.cpp's per-frequency factors (Llama 3 GGUFs store its rope scaling as rope_freqs)."""
    cfg = model.config
    rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                             cfg.rope, device)
    if file.rope_factors is not None:
        factors = file.rope_factors.to(rotary.inv_freq.device)
        if factors.shape != rotary.inv_freq.shape:
            raise ModelFileError(f"{file.path}: tensor rope_freqs.weight has "
                                 f"{factors.numel()} values, expected {rotary.inv_freq.numel()}")
        rotary.inv_freq = rotary.inv_freq / factors
    model.model.rotary = rotary


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


def _set_linear(file: GGUFFile, module: Linear, keys: list[str]) -> None:
    parts = [file.tensors[f"{k}.weight"] for k in keys]
    biases = [b for k in keys if (b := file.tensors.get(f"{k}.bias")) is not None]
    bias = torch.cat([_float(file, b) for b in biases]) if len(biases) == len(keys) else None
    kinds = {p.qtype for p in parts}
    if kinds == {F32}:  # float32 matrices stay float (packed for oneDNN like any other)
        weight = torch.cat([_float(file, p) for p in parts])
        module.weight = torch.nn.Parameter(weight, requires_grad=False)
        if module.bias is not None:
            if bias is None:  # as set_quantized: never an empty bias parameter
                raise ValueError("a biased projection needs its bias")
            module.bias = torch.nn.Parameter(bias, requires_grad=False)
        return
    if len(parts) == 1:
        module.set_quantized(_quant_weight(file, parts[0]), bias)
    elif len(kinds) == 1:
        _quant_weight(file, parts[0])  # the type check, with the tensor's name
        module.set_quantized(_stacked(file, parts), bias)
    else:
        module.set_quantized(SplitWeight(tuple(_quant_weight(file, p) for p in parts)), bias)


def _set_vector(file: GGUFFile, module: torch.nn.Module, key: str) -> None:
    module.weight = torch.nn.Parameter(_float(file, file.tensors[key]), requires_grad=False)


def load_quantized(file: GGUFFile) -> LlamaForCausalLM:
    """The model with float32 activations over the file's own blocks (CPU)."""
    cfg = file.config
    model = LlamaForCausalLM(cfg, torch.float32, "meta")  # no float storage at all
    inner = model.model
    embed = file.tensors["model.embed_tokens.weight"]
    if embed.qtype == F32:
        _set_vector(file, inner.embed_tokens, embed.key)
    else:
        inner.embed_tokens.set_quantized(_quant_weight(file, embed))
    for i, layer in enumerate(cast("list[DecoderLayer]", list(inner.layers))):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        _set_linear(file, attn.qkv_proj, [p + "self_attn." + n for n in ("q_proj", "k_proj",
                                                                         "v_proj")])
        _set_linear(file, attn.o_proj, [p + "self_attn.o_proj"])
        _set_linear(file, mlp.gate_up_proj, [p + "mlp.gate_proj", p + "mlp.up_proj"])
        _set_linear(file, mlp.down_proj, [p + "mlp.down_proj"])
        _set_vector(file, layer.input_layernorm, p + "input_layernorm.weight")
        _set_vector(file, layer.post_attention_layernorm, p + "post_attention_layernorm.weight")
    _set_vector(file, inner.norm, "model.norm.weight")
    if cfg.tie_word_embeddings:
        weight = inner.embed_tokens.weight
        if isinstance(weight, torch.Tensor):
            model.lm_head.weight = weight
        else:
            model.lm_head.set_quantized(weight)
    else:
        _set_linear(file, model.lm_head, ["lm_head"])
    _rotary(model, file, "cpu")
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise ModelFileError(f"{file.path}: nothing loaded for {', '.join(meta[:3])}")
    model.eos_ids = file.eos_ids
    return model.eval()


# --- the float reference path ----------------------------------------------------------------

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


def load_dequantized(file: GGUFFile, dtype: torch.dtype,
                     device: torch.device | str) -> LlamaForCausalLM:
    """The model in float `dtype` on the file's weights dequantised in memory."""
    from engine.execution.loader import map_key

    model = LlamaForCausalLM(file.config, dtype, device)
    params = dict(model.named_parameters())
    for key, t in file.tensors.items():
        name, shard = map_key(key, model)
        if name is None:
            continue
        if name not in params:
            raise ModelFileError(f"{file.path}: tensor {t.name} has no place in the model")
        tensor = _dequantized(t).to(device=device, dtype=dtype)
        if shard is None:
            default_weight_loader(params[name], tensor)
        else:
            params[name].weight_loader(params[name], tensor, shard)  # type: ignore[attr-defined]
    _rotary(model, file, device)
    model.eos_ids = file.eos_ids
    return model.eval()

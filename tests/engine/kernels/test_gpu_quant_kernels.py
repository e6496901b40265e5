"""The GPU block kernels (engine/kernels/gpu_quant) against gguf-py's dequantisation: on a CUDA
GPU where there is one, else run by Triton's interpreter on CPU tensors.

The interpreter executes the very kernels a GPU compiles (TRITON_INTERPRET=1 must be set before
they are imported, hence at the top; never where CUDA is, which must run them compiled).
Blocks: gguf-py's own quantisation where it has one (Q4_0, Q4_1, Q5_0, Q8_0), else random
bytes with finite f16 scales (every byte pattern of a K-quant's scales, nibbles and high bits
is a valid block). Tolerance: the kernels accumulate float32 products of exactly dequantized
values, so against a float64 reference the error is float32 rounding, a few 1e-7 of the
largest output; bf16 activations round to 8 bits.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gguf
import numpy as np
import pytest

from engine.kernels import gpu_quant
from engine.kernels.gpu_quant import layouts
from engine.kernels.quant import QuantWeight

pytest.importorskip("triton", reason="the gpu_quant kernels need Triton (the dev extra)")
DEVICE = "cpu" if gpu_quant.interpreted() else "cuda"
if gpu_quant.unusable_reason(DEVICE):
    pytest.skip(f"{gpu_quant.unusable_reason(DEVICE)}", allow_module_level=True)

TYPES = sorted(layouts.LAYOUTS)


def random_blocks(qtype: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, row_bytes] of valid blocks."""
    rng = np.random.default_rng(seed + qtype)
    _, qk, nbytes = layouts.LAYOUTS[qtype]
    try:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        return np.ascontiguousarray(gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype)))
    except NotImplementedError:  # the K-quants: gguf-py dequantizes them only
        pass
    blocks = rng.integers(0, 256, size=(rows, cols // qk, nbytes), dtype=np.uint8)

    def f16(lo: float, hi: float) -> np.ndarray:
        values = rng.uniform(lo, hi, size=(rows, cols // qk)).astype(np.float16)
        return values.view(np.uint8).reshape(rows, cols // qk, 2)
    if qtype == layouts.Q6_K:
        blocks[:, :, 208:210] = f16(0.001, 0.05)
    else:  # d, dmin
        blocks[:, :, 0:2] = f16(0.001, 0.05)
        blocks[:, :, 2:4] = f16(0.001, 0.05)
    return blocks.reshape(rows, -1)


def dequantized(qtype: int, blocks: np.ndarray) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(qtype))
    return torch.from_numpy(values.astype(np.float64))


def device_weight(qtype: int, blocks: np.ndarray, cols: int) -> gpu_quant.DeviceQuantWeight:
    host = QuantWeight(qtype, torch.from_numpy(blocks), cols, blocks.shape[0])
    return gpu_quant.to_device([host], DEVICE)


def close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    scale = float(want.abs().max())
    torch.testing.assert_close(got.double().cpu(), want, rtol=rel, atol=rel * scale)


# (rows of x, output features, input features): decode (one row, a few rows: the broadcast
# product) and prefill (tl.dot); output counts that leave part of a tile empty
SHAPES = [(1, 72, 512), (3, 40, 256), (20, 40, 512)]


@pytest.mark.parametrize("qtype", TYPES, ids=layouts.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[2]}->{s[1]}")
def test_product_matches_gguf_dequantisation(qtype: int, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    blocks = random_blocks(qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m), device="cpu")
    got = gpu_quant.matmul(x.to(DEVICE), device_weight(qtype, blocks, k))
    assert got.shape == (m, n) and got.dtype == torch.float32
    close(got, x.double() @ dequantized(qtype, blocks).T, 1e-5)


@pytest.mark.parametrize("qtype", TYPES, ids=layouts.name)
def test_embedding_rows_are_gguf_dequantisation_exactly(qtype: int) -> None:
    blocks = random_blocks(qtype, 12, 256)
    ids = torch.tensor([7, 0, 11, 7], device="cpu")
    got = gpu_quant.dequantize_rows(device_weight(qtype, blocks, 256), ids.to(DEVICE),
                                    torch.float32)
    assert torch.equal(got.double().cpu(), dequantized(qtype, blocks)[ids])


def test_parts_bias_and_bf16_activations() -> None:
    """A fused projection whose parts differ in type (a Q4_K_M file's q/k in Q4_K, v in
    Q6_K) writes each part's columns; the bias is added; bf16 in, bf16 out."""
    k = 256
    parts = [(layouts.Q4_K, 24), (layouts.Q6_K, 8), (layouts.Q8_0, 16)]
    blocks = [random_blocks(q, n, k, seed=i) for i, (q, n) in enumerate(parts)]
    weight = gpu_quant.to_device(
        [QuantWeight(q, torch.from_numpy(b), k, n) for (q, n), b in zip(parts, blocks)], DEVICE)
    assert weight.out_features == 48 and weight.type_names == ("Q4_K", "Q6_K", "Q8_0")
    assert weight.nbytes == sum(b.nbytes for b in blocks)
    full = torch.cat([dequantized(q, b) for (q, _), b in zip(parts, blocks)])
    bias = torch.randn(48, generator=torch.Generator().manual_seed(1), device="cpu")
    for rows in (1, 17):
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows), device="cpu")
        got = gpu_quant.matmul(x.to(DEVICE), weight, bias.to(DEVICE))
        close(got, x.double() @ full.T + bias.double(), 1e-5)
        xb = x.bfloat16()
        got = gpu_quant.matmul(xb.to(DEVICE), weight, bias.bfloat16().to(DEVICE))
        assert got.dtype == torch.bfloat16
        want = xb.double() @ full.T + bias.bfloat16().double()
        close(got, want, 2e-2)


def test_shapes_are_checked() -> None:
    weight = device_weight(layouts.Q8_0, random_blocks(layouts.Q8_0, 4, 64), 64)
    with pytest.raises(ValueError, match="64 inputs"):
        gpu_quant.matmul(torch.zeros(2, 32, device=DEVICE), weight)
    assert gpu_quant.matmul(torch.zeros(0, 64, device=DEVICE), weight).shape == (0, 4)
    with pytest.raises(ValueError, match="whole blocks"):
        gpu_quant.DeviceBlocks(layouts.Q4_K, torch.zeros(4, 144, dtype=torch.uint8,
                                                         device="cpu"), 100, 4)

"""The Triton kernel for out = x @ W^T (+ bias) with W in GGUF blocks, dequantized per tile.

Each program computes a [BLOCK_M, BLOCK_N] tile of the output: it walks the input features
BLOCK_K at a time, decodes the weight tile [BLOCK_K, BLOCK_N] from the blocks' bytes in
registers (decode.py) and accumulates in float32. A weight is never dequantized in memory.
Rounds of many rows multiply the tiles with tl.dot (tensor cores, the activations' dtype);
decode rounds of a few rows, where tl.dot's 16-row minimum would waste most of the work, with
a broadcast multiply and a sum. DOT_F32 widens the activations for tl.dot where the tiles
cannot be multiplied in their dtype (launch.py says when). Out-of-range rows and features are
clamped, not masked, on the weight side (their values meet zero activations or are never
stored), so the decoders load without masks.
"""
from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.gpu_quant.decode import decode


@triton.jit
def qmatmul_kernel(x_ptr, w_ptr, bias_ptr, out_ptr,
                   M, N, K, stride_xm, stride_om, row_bytes,
                   QTYPE: tl.constexpr, QK: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                   HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr,
                   BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m, mask_n = rm < M, rn < N
    rows = tl.where(mask_n, rn, 0).to(tl.int64) * row_bytes  # [BLOCK_N] byte offsets
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        mask_k = k < K
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        kk = tl.where(mask_k, k, 0)
        blk = w_ptr + rows[None, :] + ((kk // QK) * BLOCK_BYTES)[:, None]  # [BLOCK_K, BLOCK_N]
        w = decode(blk, (kk % QK)[:, None] + tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.int32),
                   QTYPE)
        if USE_DOT and DOT_F32:
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        elif USE_DOT:
            acc += tl.dot(x, w.to(x.dtype), input_precision="ieee")
        else:
            acc += tl.sum(x.to(tl.float32)[:, :, None] * w[None, :, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])

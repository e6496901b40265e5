"""The Triton kernel for an embedding lookup in GGUF blocks: the looked-up rows alone are
dequantized, straight into the activations' dtype."""
from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.gpu_quant.decode import decode


@triton.jit
def rows_kernel(ids_ptr, w_ptr, out_ptr, K, row_bytes,
                QTYPE: tl.constexpr, QK: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                BLOCK_K: tl.constexpr):
    i = tl.program_id(0)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = k < K
    kk = tl.where(mask, k, 0)
    row = tl.load(ids_ptr + i).to(tl.int64)
    blk = w_ptr + row * row_bytes + (kk // QK) * BLOCK_BYTES
    values = decode(blk, kk % QK, QTYPE)
    tl.store(out_ptr + i.to(tl.int64) * K + k, values.to(out_ptr.dtype.element_ty), mask=mask)

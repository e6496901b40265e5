"""Running the device kernels: tile sizes by row count, one launch per part of a weight."""
from __future__ import annotations

import torch

from engine.kernels.gpu_quant import layouts
from engine.kernels.gpu_quant.matmul_kernel import qmatmul_kernel
from engine.kernels.gpu_quant.rows_kernel import rows_kernel
from engine.kernels.gpu_quant.weight import DeviceBlocks, DeviceQuantWeight

FEW_ROWS = 4  # up to here a broadcast product (decode); tl.dot needs tiles of 16 rows
ROWS_BLOCK = 256  # values per program of an embedding lookup


def _tiles(rows: int) -> tuple[bool, int, int, int]:
    """(use tl.dot, BLOCK_M, BLOCK_N, BLOCK_K) for a product of `rows` rows."""
    if rows <= FEW_ROWS:
        # few rows read the weight once: wide tiles of output features, a short K step to
        # keep the [M, K, N] broadcast in registers
        return False, 1 << (rows - 1).bit_length(), 64 if rows == 1 else 32, 32
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return True, block_m, 64, 32


def _dot_f32(dtype: torch.dtype) -> bool:
    """Widen bf16 tiles for tl.dot: Triton's interpreter multiplies bf16 as its integer bits
    (numpy has no bf16); a GPU multiplies them in bf16 on its tensor cores."""
    from engine.kernels.gpu_quant import interpreted

    return dtype == torch.bfloat16 and interpreted()


def _part(x: torch.Tensor, part: DeviceBlocks, bias: torch.Tensor | None,
          out: torch.Tensor, col: int) -> None:
    rows, n = x.shape[0], part.out_features
    use_dot, bm, bn, bk = _tiles(rows)
    _, qk, block_bytes = layouts.LAYOUTS[part.qtype]
    grid = (-(-rows // bm), -(-n // bn))
    # column offsets as pointer views: out[:, col:] and bias[col:] start at the part's columns
    out_part = out[:, col:]
    bias_part = out_part if bias is None else bias[col:col + n]
    qmatmul_kernel[grid](x, part.data, bias_part, out_part, rows, n, part.in_features,
                         x.stride(0), out.stride(0), part.data.shape[1],
                         QTYPE=part.qtype, QK=qk, BLOCK_BYTES=block_bytes,
                         HAS_BIAS=bias is not None, USE_DOT=use_dot,
                         DOT_F32=_dot_f32(x.dtype), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)


def matmul(x: torch.Tensor, weight: DeviceQuantWeight,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ W^T (+ bias) -> [rows, out] in x's dtype."""
    if x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"x {list(x.shape)} does not match a weight of "
                         f"{weight.in_features} inputs")
    x = x.contiguous()
    out = torch.empty(x.shape[0], weight.out_features, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    bias = None if bias is None else bias.contiguous()
    col = 0
    for part in weight.parts:
        _part(x, part, bias, out, col)
        col += part.out_features
    return out


def dequantize_rows(weight: DeviceQuantWeight, ids: torch.Tensor,
                    dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` of a one-part weight, dequantized: [len(ids), in] in `dtype`."""
    if len(weight.parts) != 1:
        raise ValueError("an embedding table is one tensor")
    part = weight.parts[0]
    ids = ids.reshape(-1).contiguous()
    out = torch.empty(ids.shape[0], part.in_features, dtype=dtype, device=part.data.device)
    if ids.shape[0] == 0:
        return out
    _, qk, block_bytes = layouts.LAYOUTS[part.qtype]
    grid = (ids.shape[0], -(-part.in_features // ROWS_BLOCK))
    rows_kernel[grid](ids, part.data, out, part.in_features, part.data.shape[1],
                      QTYPE=part.qtype, QK=qk, BLOCK_BYTES=block_bytes, BLOCK_K=ROWS_BLOCK)
    return out

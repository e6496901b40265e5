"""Triton functions turning a tile of a GGUF weight's bytes into float32 values.

Each takes `blk`, a tile of pointers to the start of the block that holds each value, and
`j`, each value's index within its block, and returns the values of ggml's reference
dequantisation (gguf-py's `dequantize` gives the same numbers). Bytes are gathered one by one
(a block's f16 scales included, so no alignment is assumed); neighbouring values share bytes,
which the caches serve.
"""
from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.gpu_quant import layouts

# a jit function reads only globals that are constexpr
Q4_0, Q4_1, Q5_0, Q8_0 = (tl.constexpr(layouts.Q4_0), tl.constexpr(layouts.Q4_1),
                          tl.constexpr(layouts.Q5_0), tl.constexpr(layouts.Q8_0))
Q4_K, Q5_K, Q6_K = (tl.constexpr(layouts.Q4_K), tl.constexpr(layouts.Q5_K),
                    tl.constexpr(layouts.Q6_K))


@triton.jit
def _u8(p):
    return tl.load(p).to(tl.int32)


@triton.jit
def _f16(p):
    """The little-endian f16 at p, as float32."""
    bits = (tl.load(p).to(tl.uint16) | (tl.load(p + 1).to(tl.uint16) << 8))
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble(blk, qs: tl.constexpr, j):
    """The 4-bit value j of a 32-value block: low nibbles hold 0-15, high nibbles 16-31."""
    byte = _u8(blk + qs + (j % 16))
    return tl.where(j < 16, byte & 15, byte >> 4)


@triton.jit
def _q4_0(blk, j):
    return (_nibble(blk, 2, j) - 8).to(tl.float32) * _f16(blk)


@triton.jit
def _q4_1(blk, j):
    return _nibble(blk, 4, j).to(tl.float32) * _f16(blk) + _f16(blk + 2)


@triton.jit
def _q5_0(blk, j):
    high = (_u8(blk + 2 + j // 8) >> (j % 8)) & 1  # bit j of the little-endian u32 qh
    return (_nibble(blk, 6, j) + (high << 4) - 16).to(tl.float32) * _f16(blk)


@triton.jit
def _q8_0(blk, j):
    q = tl.load(blk + 2 + j).to(tl.int8, bitcast=True)
    return q.to(tl.float32) * _f16(blk)


@triton.jit
def _k_scale_min(blk, s):
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block s (0-7), packed in 12 bytes at 4."""
    a = _u8(blk + 4 + s)
    b = _u8(blk + 4 + (s + 4) % 12)
    c = _u8(blk + 4 + tl.where(s >= 4, s - 4, s))
    sc = tl.where(s < 4, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(s < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _q4_k(blk, j):
    # 64 values per 32 bytes: the low nibbles are sub-block 2i, the high ones 2i + 1
    chunk, high, lane = j // 64, (j % 64) // 32, j % 32
    byte = _u8(blk + 16 + chunk * 32 + lane)
    q = tl.where(high == 1, byte >> 4, byte & 15)
    sc, mn = _k_scale_min(blk, chunk * 2 + high)
    return _f16(blk) * sc * q.to(tl.float32) - _f16(blk + 2) * mn


@triton.jit
def _q5_k(blk, j):
    chunk, high, lane = j // 64, (j % 64) // 32, j % 32
    s = chunk * 2 + high
    byte = _u8(blk + 48 + chunk * 32 + lane)
    fifth = (_u8(blk + 16 + lane) >> s) & 1  # bit s of qh[lane]
    q = tl.where(high == 1, byte >> 4, byte & 15) + (fifth << 4)
    sc, mn = _k_scale_min(blk, s)
    return _f16(blk) * sc * q.to(tl.float32) - _f16(blk + 2) * mn


@triton.jit
def _q6_k(blk, j):
    # two halves of 128 values; in each, four quarters of 32 share ql and qh bytes
    half, quarter, lane = j // 128, (j % 128) // 32, j % 32
    low = _u8(blk + half * 64 + (quarter % 2) * 32 + lane)
    low = tl.where(quarter >= 2, low >> 4, low & 15)
    high = (_u8(blk + 128 + half * 32 + lane) >> (quarter * 2)) & 3
    scale = tl.load(blk + 192 + half * 8 + quarter * 2 + lane // 16).to(tl.int8, bitcast=True)
    q = (low | (high << 4)) - 32
    return _f16(blk + 208) * scale.to(tl.float32) * q.to(tl.float32)


@triton.jit
def decode(blk, j, QTYPE: tl.constexpr):
    """Values of type QTYPE at (block pointers, indices within the block)."""
    if QTYPE == Q4_0:
        out = _q4_0(blk, j)
    elif QTYPE == Q4_1:
        out = _q4_1(blk, j)
    elif QTYPE == Q5_0:
        out = _q5_0(blk, j)
    elif QTYPE == Q8_0:
        out = _q8_0(blk, j)
    elif QTYPE == Q4_K:
        out = _q4_k(blk, j)
    elif QTYPE == Q5_K:
        out = _q5_k(blk, j)
    else:
        tl.static_assert(QTYPE == Q6_K)
        out = _q6_k(blk, j)
    return out

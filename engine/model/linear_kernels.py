"""Matrix products of weights with activations, choosing the kernel by dtype and row count.

Where the CPU has no bf16 arithmetic (AVX2 without AVX512-BF16/AMX), torch emulates bf16 matrix
products. For one to a few rows that is still the fastest choice: decode at batch 1 is bound by
reading the weights, and bf16 halves those bytes (18.6 ms vs 36 ms for this model's step).
For more rows the emulation is compute-bound and ~3.5x slower than float32 (490 ms vs 140 ms
for the batch-32 step's products). There we widen each bf16 weight into a reused float32
scratch buffer that stays in cache and multiply in float32 with oneDNN (weights stay bf16 in
memory; the result is rounded back to bf16).

float32 weights on CPU are reordered once, after loading, into oneDNN's blocked layout
(`pack`): its matrix products then beat MKL's on the same weights, by ~25% for a batch-1 decode
step (60 -> 45 ms here) and ~20% at batch 32 (203 -> 161 ms). The packed tensor is opaque
(layout torch._mkldnn) and replaces the plain one. Elsewhere (CUDA, native bf16) this is plain
`F.linear`.
"""
from __future__ import annotations

import functools
import logging
import threading

import torch
import torch.nn.functional as F

from engine.cpu import emulated_bf16
from engine.kernels import ops

log = logging.getLogger(__name__)

# Up to this many rows the emulated bf16 kernel beats widening (measured here: 1-4 rows)
BF16_DIRECT_ROWS = 16

_scratch = threading.local()  # per thread: rounds of two executors may run concurrently


def widens(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when x @ weight.T runs in float32 on a widened copy of a bf16 weight."""
    return x.shape[0] > BF16_DIRECT_ROWS and emulated_bf16(weight.dtype, weight.device)


def widened(weight: torch.Tensor) -> torch.Tensor:
    """A float32 copy of `weight` in this thread's scratch buffer (valid until the next call)."""
    n = weight.numel()
    buf: torch.Tensor | None = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _scratch.buf = torch.empty(n, dtype=torch.float32)
    return buf[:n].view(weight.shape).copy_(weight)


def is_packed(weight: torch.Tensor) -> bool:
    return weight.layout == torch._mkldnn


@functools.cache
def onednn_works() -> bool:
    """oneDNN's packed float32 linear is present in this torch build and gives the right
    numbers (a private op of torch's, so we check it rather than trust it)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w, b, x = (torch.randn(24, 16, generator=g), torch.randn(24, generator=g),
                   torch.randn(3, 16, generator=g))
        out = _onednn(x, torch.ops.mkldnn._reorder_linear_weight(w), b)
        return bool(torch.allclose(out, F.linear(x, w, b), atol=1e-4, rtol=1e-4))
    except (AttributeError, RuntimeError) as exc:
        log.info("oneDNN packed linear unavailable (%s); using plain F.linear", exc)
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in the layout its products run fastest from: oneDNN-packed for float32 on CPU
    when that works, else itself."""
    if (weight.dtype != torch.float32 or weight.device.type != "cpu" or is_packed(weight)
            or not onednn_works()):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if x.shape[0] == 0:  # oneDNN refuses empty inputs
        return x.new_empty(0, weight.shape[0])
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ weight [out, in].T (+ bias), result in x's dtype."""
    if is_packed(weight):
        return _onednn(x, weight, bias)
    if not widens(x, weight):
        if direct_native(x, weight):
            return ops.gemv_bf16(x, weight, bias)
        return F.linear(x, weight, bias)
    return _wide_product(x, weight, bias).to(x.dtype)


def direct_native(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A few rows against an emulated-bf16 weight: Ferry's kernel (engine.kernels) keeps
    reading the weight at memory speed for 2-4 rows, where torch's slows down per row."""
    return (0 < x.shape[0] <= BF16_DIRECT_ROWS and x.dtype == torch.bfloat16
            and weight.is_contiguous() and emulated_bf16(weight.dtype, weight.device)
            and ops.usable(weight))


def mm_into(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    """out = x @ weight.T without a bias; `out` may be a strided column block."""
    if direct_native(x, weight):
        out.copy_(ops.gemv_bf16(x, weight))
    elif not widens(x, weight):
        torch.mm(x, weight.t(), out=out)
    else:
        out.copy_(_wide_product(x, weight, None))


def _wide_product(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x @ widened(weight).T in float32; oneDNN's product is ~25% faster than MKL's here even
    on a plain (unpacked) weight (bf16 batch-32 step 274 -> 206 ms)."""
    wide, b = widened(weight), None if bias is None else bias.float()
    if onednn_works():
        return _onednn(x.float(), wide, b)
    return F.linear(x.float(), wide, b)

"""Matrix products of weights with activations, choosing the kernel by dtype and row count.

Where the CPU has no bf16 arithmetic (AVX2 without AVX512-BF16/AMX), torch emulates bf16 matrix
products. For a few rows bf16 weights are still the right choice: decode at small batch is
bound by reading the weights, and bf16 halves those bytes. Ferry's own kernel
(engine.kernels, `ops.gemv_bf16`) streams a bf16 weight at memory speed for 1-16 rows; torch's
emulated kernel is as fast for one row but ~2x slower per extra row, so without Ferry's
kernels only 1-4 rows go direct. For more rows the product is compute-bound and runs in
float32 with oneDNN: on a float32 copy of the weights kept from loading (`wide_copy`, when
all of them fit in llama.WIDE_COPY_LIMIT), else on each weight widened per product into a
reused scratch buffer that stays in cache. Results are rounded back to bf16.

float32 weights on CPU are reordered once, after loading, into oneDNN's blocked layout
(`pack`): its matrix products then beat MKL's on the same weights, by ~25% for a batch-1 decode
step (60 -> 45 ms here) and ~20% at batch 32 (203 -> 161 ms). The packed tensor is opaque
(layout torch._mkldnn) and replaces the plain one. Elsewhere (CUDA, native bf16) this is plain
`F.linear`. `product_for` picks the function once per weight; `Linear` keeps it.

A float16 weight on the CPU (a vision tower's, from a projector file stored in F16) stays
float16: each product widens it to float32 for that product only, so the tower costs its
file's bytes rather than twice them.

Quantized weights (a GGUF's blocks, or float weights quantized at load) are an
engine.kernels.quant.QuantWeight, multiplied by `quant.quant_matmul` (which picks its few-row
or many-row path itself), or a SplitWeight: the parts of a fused projection (qkv, gate_up)
whose block types differ, multiplied one by one into column slices of the output, or a
PaddedWeight: blocks of a float matrix whose rows are not whole blocks (a vision tower's 3,420
inputs), quantized with zero columns added, its products taking the input padded alike.

On a GPU a GGUF's blocks stay as they are in device memory (engine.kernels.gpu_quant's
DeviceQuantWeight, all parts of a fused projection in one): Triton kernels dequantize tiles
inside the product, in the activations' dtype.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
import torch.nn.functional as F

from engine.execution.cpu import cpu_has_native_bf16, emulated_bf16
from engine.kernels import ops
from engine.kernels.gpu_quant.weight import DeviceQuantWeight

if TYPE_CHECKING:
    from engine.kernels.quant import QuantWeight

log = logging.getLogger(__name__)

# Up to this many rows a bf16 product beats widening (measured here): torch's emulated kernel
# for 1-4 rows, Ferry's (engine.kernels) for 1-16
TORCH_DIRECT_ROWS = 4
NATIVE_DIRECT_ROWS = 16

Product = Callable[[torch.Tensor, Any, "torch.Tensor | None"], torch.Tensor]


@dataclass(frozen=True, slots=True)
class SplitWeight:
    """Quantized parts of one fused projection, stacked by rows in order (e.g. q, k, v)."""

    parts: tuple[QuantWeight, ...]

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


@dataclass(frozen=True, slots=True)
class PaddedWeight:
    """Blocks of a matrix of `in_features` inputs quantized with zero columns added up to
    whole blocks (`blocks.in_features`); a product pads its input with zeros alike, which
    adds nothing to the sums."""

    blocks: QuantWeight
    in_features: int

    @property
    def out_features(self) -> int:
        return self.blocks.out_features

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    @property
    def parts(self) -> tuple[QuantWeight, ...]:  # as a SplitWeight's: the blocks held
        return (self.blocks,)


# what a Linear multiplies by: a float tensor (maybe oneDNN-packed), quantized blocks on the
# host, or blocks on the device
Weight: TypeAlias = "torch.Tensor | QuantWeight | SplitWeight | PaddedWeight | DeviceQuantWeight"


QUANTIZE_CHUNK = 1 << 16  # values quantized at a time: the float32 copies stay small


def quantized(weight: torch.Tensor, qtype: int) -> QuantWeight | PaddedWeight:
    """A float matrix [out, in] (any float dtype, on the host) as blocks of `qtype`
    (quant.quantize's), padded with zero columns where its rows are not whole blocks. Rows
    are widened to float32 a few at a time: a whole float32 copy of each matrix of a model
    would leave the heap holding them."""
    from engine.kernels import quant

    out_f, in_f = weight.shape
    pad = -in_f % quant.block_size(qtype)
    data = torch.empty(out_f, quant.row_bytes(qtype, in_f + pad), dtype=torch.uint8,
                       device="cpu")
    step = max(1, QUANTIZE_CHUNK // in_f)
    for start in range(0, out_f, step):
        rows = weight[start:start + step].detach().to("cpu", torch.float32)
        data[start:start + step] = quant.quantize(F.pad(rows, (0, pad)), qtype).data
    blocks = quant.QuantWeight(qtype, data, in_f + pad, out_f)
    return blocks if pad == 0 else PaddedWeight(blocks, in_f)


def stacked_rows(parts: Sequence[Weight]) -> Weight:
    """Matrices of one input width stacked by rows in order, for one product (q, k and v):
    float tensors joined, host blocks of one type joined, of several types a SplitWeight."""
    from engine.kernels.quant import QuantWeight

    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat([p for p in parts if isinstance(p, torch.Tensor)])
    blocks = [p for p in parts if isinstance(p, QuantWeight)]
    if len(blocks) != len(parts):
        raise ValueError("stacked_rows: floats and blocks, or blocks on the device, in one "
                         "product")
    if len({b.qtype for b in blocks}) == 1:
        data = torch.cat([b.data for b in blocks])
        return QuantWeight(blocks[0].qtype, data, blocks[0].in_features, data.shape[0])
    return SplitWeight(tuple(blocks))


def weight_nbytes(weight: Weight) -> int:
    """The bytes a weight holds: a tensor's elements, or its blocks."""
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    return weight.nbytes


def is_quantized(weight: object) -> bool:
    """Blocks on the host or on the device (anything but a float tensor)."""
    return not isinstance(weight, torch.Tensor)


def on_host_blocks(weight: object) -> bool:
    """A QuantWeight or a SplitWeight: blocks the native CPU kernels multiply."""
    return is_quantized(weight) and not isinstance(weight, DeviceQuantWeight)


def host_blocks(weight: object) -> tuple[QuantWeight, ...]:
    """The blocks on the host a weight multiplies (a SplitWeight's or PaddedWeight's parts);
    none for a float tensor or blocks on the device."""
    from engine.kernels.quant import QuantWeight

    if isinstance(weight, QuantWeight):
        return (weight,)
    if isinstance(weight, (SplitWeight, PaddedWeight)):
        return weight.parts
    return ()


def _device(x: torch.Tensor, weight: DeviceQuantWeight,
            bias: torch.Tensor | None) -> torch.Tensor:
    from engine.kernels import gpu_quant

    return gpu_quant.matmul(x, weight, bias)


def _quant(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None) -> torch.Tensor:
    from engine.kernels import quant

    return quant.quant_matmul(x, weight, bias)


def _split(x: torch.Tensor, weight: SplitWeight, bias: torch.Tensor | None) -> torch.Tensor:
    from engine.kernels import quant

    out = x.new_empty(x.shape[0], weight.out_features)  # [rows, sum of parts' out]
    col = 0
    for part in weight.parts:
        out[:, col:col + part.out_features] = quant.quant_matmul(x, part)
        col += part.out_features
    return out if bias is None else out.add_(bias)


def _padded(x: torch.Tensor, weight: PaddedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    from engine.kernels import quant

    pad = weight.blocks.in_features - weight.in_features
    return quant.quant_matmul(F.pad(x, (0, pad)), weight.blocks, bias)


_scratch = threading.local()  # per thread: rounds of two executors may run concurrently


def native_direct(weight: torch.Tensor) -> bool:
    """Ferry's bf16 kernel can multiply this weight (emulated bf16, kernels loaded)."""
    return (emulated_bf16(weight.dtype, weight.device) and weight.is_contiguous()
            and ops.usable(weight))


def direct_rows(weight: torch.Tensor) -> int:
    """Up to how many rows x @ weight.T runs directly in bf16 (more rows are widened)."""
    return NATIVE_DIRECT_ROWS if native_direct(weight) else TORCH_DIRECT_ROWS


def widened(weight: torch.Tensor) -> torch.Tensor:
    """A float32 copy of `weight` in this thread's scratch buffer (valid until the next call)."""
    n = weight.numel()
    buf: torch.Tensor | None = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < n:
        buf = _scratch.buf = torch.empty(n, dtype=torch.float32)
    return buf[:n].view(weight.shape).copy_(weight)


def is_packed(weight: torch.Tensor) -> bool:
    mkldnn: torch.layout = torch._mkldnn  # type: ignore[attr-defined]  # real, not in the stubs
    return weight.layout == mkldnn


@functools.cache
def onednn_works() -> bool:
    """oneDNN's packed float32 linear is present in this torch build and gives the right
    numbers (a private op of torch's, so we check it rather than trust it)."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]  # torch's
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w, b, x = (torch.randn(24, 16, generator=g), torch.randn(24, generator=g),
                   torch.randn(3, 16, generator=g))
        out = onednn_linear(x, torch.ops.mkldnn._reorder_linear_weight(w), b)
        return bool(torch.allclose(out, F.linear(x, w, b), atol=1e-4, rtol=1e-4))
    except (AttributeError, RuntimeError) as exc:
        log.info("oneDNN packed linear unavailable (%s); using plain F.linear", exc)
        return False


@functools.cache
def native_bf16_products() -> bool:
    """oneDNN multiplies bf16 in hardware here (AVX512-BF16 or AMX-BF16, as
    cpu_has_native_bf16 reads the CPU and FERRY_CPU's cap)."""
    return (cpu_has_native_bf16() and onednn_works()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def pack(weight: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """`weight` in the layout its products run fastest from: oneDNN-packed for float32 on CPU
    when that works, else itself. `bf16`: packed as bf16, its products taking bf16 inputs
    (onednn_linear casts them), where native_bf16_products."""
    if (weight.dtype != torch.float32 or weight.device.type != "cpu" or is_packed(weight)
            or not onednn_works()):
        return weight
    if bf16 and native_bf16_products():
        weight = weight.detach().to(torch.bfloat16)
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    return packed


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  wide: bool = True) -> torch.Tensor:
    """x [T, in] @ weight.T (+ bias) from a packed weight: float32 in and out, also for a
    bf16 weight (its products then take x and the bias in bf16, accumulating in float32).
    `wide=False`: a bf16 weight's result left in bf16, for a next product that takes it in
    bf16 anyway (two conversions less)."""
    if x.shape[0] == 0:  # oneDNN refuses empty inputs
        return x.new_empty(0, weight.shape[0])
    if weight.dtype == torch.bfloat16:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x.to(torch.bfloat16).contiguous(), weight,
            None if bias is None else bias.to(torch.bfloat16), "none", [], "")
        return out.float() if wide else out
    out = torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return out


def product_for(weight: Weight, wide: torch.Tensor | None = None) -> Product:
    """The function computing x @ weight.T (+ bias) for this weight, chosen once (Linear
    keeps it: per-call checks cost microseconds ~120 times per decode step). `wide`: a
    oneDNN-packed float32 copy of a bf16 weight (`wide_copy`) for products of many rows."""
    if isinstance(weight, SplitWeight):
        return _split
    if isinstance(weight, PaddedWeight):
        return _padded
    if isinstance(weight, DeviceQuantWeight):
        return _device
    if not isinstance(weight, torch.Tensor):  # is_quantized
        return _quant
    if is_packed(weight):
        return onednn_linear
    if weight.dtype == torch.float16 and weight.device.type == "cpu":
        return _half_widened
    if not emulated_bf16(weight.dtype, weight.device):
        return F.linear
    direct = _bf16_native if native_direct(weight) else _bf16_torch
    if wide is None:
        return direct
    rows = direct_rows(weight)

    def product(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] <= rows:
            return direct(x, weight, bias)
        return onednn_linear(x.float(), wide, None if bias is None else bias.float()).to(x.dtype)
    return product


def wants_wide_copy(weight: torch.Tensor) -> bool:
    """Products of many rows with this weight would widen it each time (emulated bf16)."""
    return emulated_bf16(weight.dtype, weight.device) and onednn_works()


def wide_copy(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight widened once to float32 and packed for oneDNN: the same values the
    per-product widening gives, without widening every weight at every step, at the price
    of float32 weights' memory on top of the bf16 ones."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach().float())
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ weight [out, in].T (+ bias), result in x's dtype."""
    return product_for(weight)(x, weight, bias)


def _half_widened(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """A float16 weight kept as its file stores it (a vision tower's): widened and packed for
    this product only. The widening is exact; widening and packing make a product over an
    image's 1,564 rows 4-9% slower than one from a kept float32 copy (measured on an AMD
    EPYC), and that copy lives for one product, not the model's lifetime."""
    wide = pack(weight.float())
    b = None if bias is None else bias.float()
    out = onednn_linear(x.float(), wide, b) if is_packed(wide) else F.linear(x.float(), wide, b)
    return out.to(x.dtype)


def _bf16_native(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    if 0 < x.shape[0] <= NATIVE_DIRECT_ROWS and x.dtype == torch.bfloat16:
        return ops.gemv_bf16(x, weight, bias)
    return _wide_product(x, weight, bias).to(x.dtype)


def _bf16_torch(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    if x.shape[0] <= TORCH_DIRECT_ROWS:
        return F.linear(x, weight, bias)
    return _wide_product(x, weight, bias).to(x.dtype)


WIDEN_BLOCK = 2048  # weight rows widened at a time: the float32 block stays in cache


def _wide_product(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x @ widened(weight).T in float32, a block of weight rows at a time (an LM head of 49k
    rows widened whole would not stay in cache); oneDNN's product is ~25% faster than MKL's
    here even on a plain (unpacked) weight (bf16 batch-32 step 274 -> 206 ms)."""
    xf = x.float()
    if weight.shape[0] <= WIDEN_BLOCK:
        return _widened_product(xf, weight, bias)
    out = xf.new_empty(x.shape[0], weight.shape[0])
    for start in range(0, weight.shape[0], WIDEN_BLOCK):
        end = min(start + WIDEN_BLOCK, weight.shape[0])
        out[:, start:end] = _widened_product(
            xf, weight[start:end], None if bias is None else bias[start:end])
    return out


def _widened_product(xf: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    wide, b = widened(weight), None if bias is None else bias.float()
    if onednn_works():
        return onednn_linear(xf, wide, b)
    return F.linear(xf, wide, b)

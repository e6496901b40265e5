"""GGUF block-quantized weights kept in their block format, and products over them.

A QuantWeight is the raw bytes of a GGUF tensor ([out, row_bytes] uint8, ggml's block layout,
possibly a view of the memory-mapped file). `quant_matmul` multiplies float32 activations by it
with the native kernels (csrc/quant*.c: activations quantized to int8 per call, AVX2 integer
dot products, a plain-C path elsewhere). Without the native library (no compiler, or
FERRY_NATIVE_KERNELS=0) everything still works: gguf-py dequantizes tiles of rows and torch
multiplies them, slowly, never holding the whole float weight.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass

import numpy as np
import torch

from engine.kernels import cpu_level, native
from engine.kernels.invariance import batch_invariant

F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 8, 12, 13, 14, 30

# ggml type id -> (name, values per block, bytes per block)
_TYPES: dict[int, tuple[str, int, int]] = {
    F32: ("F32", 1, 4), F16: ("F16", 1, 2), BF16: ("BF16", 1, 2),
    Q4_0: ("Q4_0", 32, 18), Q4_1: ("Q4_1", 32, 20), Q5_0: ("Q5_0", 32, 22),
    Q8_0: ("Q8_0", 32, 34), Q4_K: ("Q4_K", 256, 144), Q5_K: ("Q5_K", 256, 176),
    Q6_K: ("Q6_K", 256, 210),
}
QUANTIZABLE = (Q8_0, Q4_0)  # what quantize() writes

# From this many rows on (prefill, big decode rounds), tiles of W dequantized into the cache
# and multiplied in AMX (ferry_qgemm_bf16) or by torch beat the int8 dot products, whose cost
# grows with every row. The block types on the SIMD paths instead multiply groups of 8 rows
# in lanes (csrc/quant_lanes.h, quant_lanes_k.h), which beat float32 tiles at every round
# size, prefill chunks included, so without AMX they take every round (MANY_ROWS_LANES:
# never). Their int8 activations (one scale per 32 or 256 values, as llama.cpp's) round about
# as much as the bf16 activations of the AMX and bf16 tiles.
# With AMX the block types in lanes keep their lanes up to MANY_ROWS_AMX_LANES: the AMX
# kernel's cost is mostly dequantizing W (flat up to 32 rows), which the lanes beat below 16
# rows (docs/kernels.md, Thresholds), the K-quants' (AVX-512 VNNI lanes) below 24; the
# types without lanes turn to AMX from 8.
MANY_ROWS_AMX, MANY_ROWS_BF16, MANY_ROWS_F32, MANY_ROWS_LANES = 8, 12, 24, 1 << 62
MANY_ROWS_AMX_LANES, MANY_ROWS_AMX_K = 16, 24  # csrc/quant_gemm.c ferry_qgemm_takes agrees
AMX_MAX_ROWS = 1024  # from here on torch's bf16 matmul (oneDNN) on dequantized tiles is as fast
_TILE_ELEMS = 1 << 18  # values per dequantized tile: within the L2 cache
_EQUANT = -2


def type_name(qtype: int) -> str:
    """"Q4_K", ... for a ggml type id (ggml's own name for ids Ferry cannot run)."""
    if qtype in _TYPES:
        return _TYPES[qtype][0]
    try:
        import gguf

        return f"{gguf.GGMLQuantizationType(qtype).name} (unsupported)"
    except (ImportError, ValueError):
        return f"type {qtype} (unknown)"


def type_id(name: str) -> int | None:
    """The ggml type id of "Q4_K", ...; None for a name that is not a block type Ferry runs."""
    return next((q for q, (n, _, _) in _TYPES.items() if n == name), None)


def supported(qtype: int) -> bool:
    return qtype in _TYPES


def _info(qtype: int) -> tuple[str, int, int]:
    if qtype not in _TYPES:
        raise ValueError(f"block type {type_name(qtype)} is not supported; Ferry runs "
                         + ", ".join(name for name, _, _ in _TYPES.values()))
    return _TYPES[qtype]


def block_size(qtype: int) -> int:
    """Values in one block of `qtype` (1 for the float types)."""
    return _info(qtype)[1]


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one row of `in_features` values; ValueError if they do not fill whole blocks."""
    name, block, nbytes = _info(qtype)
    if in_features <= 0 or in_features % block:
        raise ValueError(f"{name} rows hold whole blocks of {block} values; "
                         f"{in_features} values per row do not fit")
    return in_features // block * nbytes


@dataclass(frozen=True, slots=True)
class QuantWeight:
    qtype: int
    data: torch.Tensor  # uint8 [out_features, row_bytes], C-contiguous
    in_features: int
    out_features: int

    def __post_init__(self) -> None:
        rb = row_bytes(self.qtype, self.in_features)
        d = self.data
        if d.dtype != torch.uint8 or d.device.type != "cpu" or not d.is_contiguous():
            raise ValueError(f"{type_name(self.qtype)} weight data must be contiguous CPU uint8, "
                             f"got {d.dtype} on {d.device}")
        if tuple(d.shape) != (self.out_features, rb):
            raise ValueError(f"{type_name(self.qtype)} weight [{self.out_features}, "
                             f"{self.in_features}] needs data [{self.out_features}, {rb}] bytes, "
                             f"got {list(d.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def type_name(self) -> str:
        return type_name(self.qtype)


def _c(w: QuantWeight) -> ctypes.Structure:
    """The ferry_weight struct (csrc/quant.h) describing w; keep it alive across the call."""
    return native.struct("ferry_weight")(w.qtype, 0, w.data.data_ptr(), w.in_features,
                                         w.out_features, w.data.shape[1])


def _lib() -> ctypes.CDLL | None:
    lib = native.library()
    if lib is None or not hasattr(lib, "ferry_qmatmul"):
        return None
    return lib


def _check(rc: int, what: str) -> None:
    if rc == _EQUANT:
        raise ValueError(f"{what}: the kernels refused the weight's type or shape")
    if rc != 0:
        raise MemoryError(f"{what}: out of memory in the native kernels")


PATHS = ("plain", "avx2", "avx-vnni", "avx512-vnni")  # the native dot products, slowest first
_cap = cpu_level.max_path()  # FERRY_CPU's cap, else the CPU's best


def kernel_path(qtype: int | None = None) -> str:
    """What quant_matmul runs (for weights of `qtype`; None: the best of any type): one of
    PATHS, or "torch" (no native library)."""
    lib = _lib()
    if lib is None:
        return "torch"
    path = lib.ferry_qpath(_cap)
    if qtype is not None and supported(qtype):
        path = lib.ferry_qtype_path(qtype)
    return PATHS[path]


def force_path(name: str | None) -> str:
    """Use at most the dot products `name` (one of PATHS; None: the CPU's best), so tests can
    compare the paths on one machine; returns the path that now runs. FERRY_CPU's cap
    still holds: a path above it is not taken."""
    global _cap
    most = cpu_level.max_path()
    _cap = most if name is None else min(most, PATHS.index(name))
    return kernel_path()


def quant_matmul(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """x [rows, in] float32 @ W.T (+ bias) -> [rows, out] float32."""
    if x.dim() != 2 or x.shape[1] != w.in_features or x.dtype != torch.float32:
        raise ValueError(f"quant_matmul: x must be float32 [rows, {w.in_features}], got "
                         f"{x.dtype} {list(x.shape)}")
    if bias is not None and (bias.shape != (w.out_features,) or bias.dtype != torch.float32):
        raise ValueError(f"quant_matmul: bias must be float32 [{w.out_features}]")
    rows = x.shape[0]
    lib = _lib()
    many = lib is None or rows >= many_rows(w.qtype)
    if w.qtype == F32 and many and (wf := _float_view(w)) is not None:
        return torch.nn.functional.linear(x, wf, bias)  # the bytes are the float matrix
    if lib is None:
        return _tiled_matmul(x, w, bias)
    gemm = many and rows < AMX_MAX_ROWS and w.qtype != F32 and uses_amx(w)
    if many and not gemm:  # (an F32 weight here is one torch cannot view: float32 tiles)
        return _tiled_matmul(x, w, bias, torch.float32 if w.qtype == F32 else tile_dtype())
    if x.stride(1) != 1:
        x = x.contiguous()
    bias = None if bias is None else bias.contiguous()
    y = torch.empty(rows, w.out_features, dtype=torch.float32)
    cw = _c(w)
    kernel = lib.ferry_qgemm_bf16 if gemm else lib.ferry_qmatmul
    _check(kernel(x.data_ptr(), rows, x.stride(0), ctypes.addressof(cw),
                  None if bias is None else bias.data_ptr(), y.data_ptr(), w.out_features),
           "quant_matmul")
    return y


def native_rows(w: QuantWeight) -> int:
    """The most rows for which quant_matmul multiplies w in Ferry's own kernels, as C's
    ferry_proj_product does: the int8 products, and where AMX takes w's many-row products the AMX
    kernel (up to AMX_MAX_ROWS; ferry_qgemm_takes agrees); else below many_rows, from where
    torch multiplies dequantized tiles, which C has not."""
    if w.qtype != F32 and uses_amx(w):
        return AMX_MAX_ROWS - 1
    return many_rows(w.qtype) - 1


def uses_amx(w: QuantWeight) -> bool:
    """Whether w's many-row product runs in the native AMX kernel (AMX CPUs, the best
    dot-product path not capped by force_path, rows of whole 32-value groups)."""
    return _amx_in_force() and w.in_features % 32 == 0


@functools.cache
def amx_available() -> bool:
    """AMX-BF16 on this CPU and granted by the kernel (native library built)."""
    lib = _lib()
    return lib is not None and bool(lib.ferry_qgemm_available())


def _amx_in_force() -> bool:
    return _cap == len(PATHS) - 1 and cpu_level.allows_bf16() and amx_available() \
        and not batch_invariant()


@functools.cache
def tile_dtype() -> torch.dtype:
    """bfloat16 tiles where the CPU multiplies bf16 in AMX tiles (several times float32's
    speed there; products then round to bf16 as Ferry's bf16 mode does), else float32."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    native_bf16 = amx is not None and amx() and cpu_level.allows_bf16()
    return torch.bfloat16 if native_bf16 else torch.float32


def many_rows(qtype: int | None = None) -> int:
    """The row count from which quant_matmul multiplies dequantized tiles instead (for weights
    of `qtype`; None: the lowest over all types). Never under batch invariance: every row
    then runs in lanes or the dot products, as it would alone."""
    if batch_invariant():
        return MANY_ROWS_LANES
    lanes = qtype is not None and uses_lanes(qtype)
    if _amx_in_force():
        if not lanes or qtype is None:
            return MANY_ROWS_AMX
        # the K-quants (256-value blocks, C's ACT_256) keep their lanes longer
        return MANY_ROWS_AMX_K if _info(qtype)[1] == 256 else MANY_ROWS_AMX_LANES
    if lanes:
        return MANY_ROWS_LANES
    return MANY_ROWS_BF16 if tile_dtype() == torch.bfloat16 else MANY_ROWS_F32


def uses_lanes(qtype: int) -> bool:
    """Whether quant_matmul multiplies groups of rows of this type in lanes (the block types
    on the SIMD paths; csrc/quant_lanes.h, quant_lanes_k.h)."""
    lib = _lib()
    return lib is not None and supported(qtype) and lib.ferry_qlanes(qtype) > 0


def _float_view(w: QuantWeight) -> torch.Tensor | None:
    """An F32 weight's bytes as the float matrix they are (None if not 4-byte aligned)."""
    if w.data.data_ptr() % 4:
        return None
    return w.data.view(torch.float32).view(w.out_features, w.in_features)


def _tiled_matmul(x: torch.Tensor, w: QuantWeight, bias: torch.Tensor | None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize tiles of W's rows (in `dtype`) into one reused buffer that stays in cache,
    and let torch multiply each; the whole float weight never exists."""
    y = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    xt = x.to(dtype)
    step = max(1, _TILE_ELEMS // w.in_features)
    buf = _tile_buffer(step * w.in_features, dtype)
    lib = _lib()
    for o in range(0, w.out_features, step):
        n = min(step, w.out_features - o)
        tile = buf[:n * w.in_features].view(n, w.in_features)  # [n, in]
        if lib is None:
            tile.copy_(dequantize_rows(w, torch.arange(o, o + n), dtype))
        else:
            part = native.struct("ferry_weight")(w.qtype, 0, w.data[o].data_ptr(), w.in_features,
                                                 n, w.data.shape[1])
            _check(lib.ferry_qdequantize(ctypes.addressof(part), None, n, tile.data_ptr(),
                                         0 if dtype == torch.float32 else 1), "dequantize")
        if dtype == torch.float32:
            torch.matmul(xt, tile.T, out=y[:, o:o + n])
        else:
            y[:, o:o + n] = torch.matmul(xt, tile.T)
    if bias is not None:
        y += bias
    return y


_tiles = threading.local()


def _tile_buffer(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-thread scratch tile, reused across calls (a fresh one would page-fault)."""
    key = f"buf_{dtype}".replace(".", "_")
    buf = getattr(_tiles, key, None)
    if buf is None or buf.numel() < n:
        # a normal tensor even when made under inference mode (the engine thread): a later
        # call outside it (loading, a test) may then still write into it
        with torch.inference_mode(False):
            buf = torch.empty(n, dtype=dtype)
        setattr(_tiles, key, buf)
    return buf


def dequantize(w: QuantWeight) -> torch.Tensor:
    """float32 [out, in], bit for bit gguf-py's dequantize."""
    return _dequantize(w, None, torch.float32)


def dequantize_rows(w: QuantWeight, ids: torch.Tensor, dtype: torch.dtype = torch.float32
                    ) -> torch.Tensor:
    """Embedding lookup: int64 ids [n] -> [n, in] float32 (exact) or bfloat16 (rounded to
    nearest even); only those rows are decoded."""
    if ids.dim() != 1:
        raise ValueError(f"dequantize_rows: ids must be 1-D, got {list(ids.shape)}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize_rows: dtype float32 or bfloat16, not {dtype}")
    ids = ids.to(torch.int64).contiguous()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= w.out_features):
        raise ValueError(f"dequantize_rows: ids must lie in [0, {w.out_features})")
    return _dequantize(w, ids, dtype)


def _dequantize(w: QuantWeight, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    n = w.out_features if ids is None else ids.numel()
    lib = _lib()
    if lib is None:
        import gguf

        rows = w.data if ids is None else w.data[ids]
        values = gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType(w.qtype))
        values = np.array(values, dtype=np.float32, copy=True)  # never a view of the weight's bytes
        return torch.from_numpy(values).view(n, w.in_features).to(dtype)
    out = torch.empty(n, w.in_features, dtype=dtype)
    cw = _c(w)
    _check(lib.ferry_qdequantize(ctypes.addressof(cw), None if ids is None else ids.data_ptr(),
                                 n, out.data_ptr(), 0 if dtype == torch.float32 else 1),
           "dequantize")
    return out


def quantize(weight: torch.Tensor, qtype: int) -> QuantWeight:
    """float [out, in] -> Q8_0 or Q4_0 blocks, bit for bit gguf-py's quantize."""
    if qtype not in QUANTIZABLE:
        raise ValueError(f"quantize writes Q8_0 or Q4_0, not {type_name(qtype)}")
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"quantize: weight must be a float matrix, got {weight.dtype} "
                         f"{list(weight.shape)}")
    out_f, in_f = weight.shape
    rb = row_bytes(qtype, in_f)
    x = weight.detach().to("cpu", torch.float32).contiguous()
    lib = _lib()
    if lib is None:
        import gguf

        blocks = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType(qtype))
        return QuantWeight(qtype, torch.from_numpy(np.ascontiguousarray(blocks)).view(out_f, rb),
                           in_f, out_f)
    data = torch.empty(out_f, rb, dtype=torch.uint8)
    _check(lib.ferry_qquantize(x.data_ptr(), out_f, in_f, qtype, data.data_ptr()), "quantize")
    return QuantWeight(qtype, data, in_f, out_f)

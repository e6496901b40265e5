"""GGUF block-quantized weights (engine/kernels/quant.py, csrc/quant*.c) against gguf-py.

Tolerances (why): dequantization is exact (same float32 operations as gguf-py). A product
quantizes the activations to int8 (per 32 values, or per 256 for K-quants; float weights use
float activations), so it is compared with W_deq @ x_hat, x_hat the activations as the kernel
quantized them (emulated here in numpy): |y - ref| <= 1e-5 * (|W_deq| @ |x_hat|), float32
rounding only. Against the unquantized x the relative error is below 1.5% (int8 rounding).
The plain-C and AVX2 paths compute the same integer block sums; with power-of-two scales every
float step is exact too, and then both must equal the exact integer result bit for bit.
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterator

import gguf
import numpy as np
import pytest
import torch

from engine.kernels import native, quant
from engine.kernels.quant import QuantWeight

GQ = gguf.GGMLQuantizationType
BLOCK_TYPES = [quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q8_0, quant.Q4_K, quant.Q5_K,
               quant.Q6_K]
FLOAT_TYPES = [quant.F32, quant.F16, quant.BF16]
ALL_TYPES = BLOCK_TYPES + FLOAT_TYPES
# where the f16 scales sit in each block: (offset, kind) with kind "d" (positive scale) or
# "m" (Q4_1's min, either sign)
SCALES = {quant.Q4_0: [(0, "d")], quant.Q4_1: [(0, "d"), (2, "m")], quant.Q5_0: [(0, "d")],
          quant.Q8_0: [(0, "d")], quant.Q4_K: [(0, "d"), (2, "d")],
          quant.Q5_K: [(0, "d"), (2, "d")], quant.Q6_K: [(208, "d")]}


@pytest.fixture(params=quant.PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    if quant.kernel_path() == "torch":
        pytest.skip(native.status())
    got = quant.force_path(request.param)
    if got != request.param:
        quant.force_path(None)
        pytest.skip(f"this CPU does not run {request.param}")
    yield request.param
    quant.force_path(None)


def on_every_path(x: torch.Tensor, w: QuantWeight) -> dict[str, np.ndarray]:
    """quant_matmul(x, w) on each native path this CPU runs."""
    out = {}
    try:
        for name in quant.PATHS:
            if quant.force_path(name) == name:
                out[name] = quant.quant_matmul(x, w).numpy()
    finally:
        quant.force_path(None)
    return out


def test_native_quant_kernels_build_where_the_kernels_do() -> None:
    if native.library() is not None:
        assert quant.kernel_path() in quant.PATHS


def test_kernel_path_per_type_names_what_runs() -> None:
    """The block types have AVX-512 dot products, the float types not: they name the path
    they run."""
    best = quant.kernel_path()
    for qtype in ALL_TYPES:
        got = quant.kernel_path(qtype)
        if qtype not in (quant.F32, quant.F16, quant.BF16) or best != "avx512-vnni":
            assert got == best
        else:
            assert got in ("avx2", "avx-vnni")
    assert quant.type_id("Q6_K") == quant.Q6_K and quant.type_id("IQ2_XS") is None


def random_weight(qtype: int, out: int, inn: int, rng: np.random.Generator,
                  exact: bool = False) -> QuantWeight:
    """Random blocks with sane scales; exact: power-of-two scales and small sub-scales so every
    float step of a product is exact."""
    if qtype in FLOAT_TYPES:
        w = rng.standard_normal((out, inn)).astype(np.float32) * 0.1
        if exact:
            w = np.round(w * 64) / 64
        raw = {quant.F32: w, quant.F16: w.astype(np.float16),
               quant.BF16: gguf.quants.quantize(w, GQ.BF16)}[qtype]
        data = np.ascontiguousarray(raw).view(np.uint8).reshape(out, -1)
        return QuantWeight(qtype, torch.from_numpy(data.copy()), inn, out)
    _, block, nbytes = quant._TYPES[qtype]
    nb = out * inn // block
    blocks = rng.integers(0, 256, (nb, nbytes), dtype=np.uint8)
    for off, kind in SCALES[qtype]:
        if exact:
            v = np.float16(2.0) ** rng.integers(-8, -3, nb).astype(np.float16)
        else:
            v = rng.uniform(0.001, 0.02, nb).astype(np.float16)
        if kind == "m":
            v = v * np.where(rng.random(nb) < 0.5, -1, 1).astype(np.float16)
        blocks[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if exact and qtype in (quant.Q4_K, quant.Q5_K):  # 6-bit scales and mins <= 3
        blocks[:, 4:12] &= 0x03
        blocks[:, 12:16] &= 0x33
    if exact and qtype == quant.Q6_K:  # int8 scales in -3..3
        blocks[:, 192:208] = rng.integers(-3, 4, (nb, 16)).astype(np.int8).view(np.uint8)
    data = blocks.reshape(out, -1)
    return QuantWeight(qtype, torch.from_numpy(np.ascontiguousarray(data)), inn, out)


def gguf_dequant(w: QuantWeight) -> np.ndarray:
    return gguf.quants.dequantize(w.data.numpy(), GQ(w.qtype)).reshape(w.out_features, -1)


def emulate_activations(x: np.ndarray, qtype: int) -> np.ndarray:
    """The kernel's int8 activations, dequantized (float weights, or the torch fallback: x)."""
    if qtype in FLOAT_TYPES or quant.kernel_path() == "torch":
        return x.astype(np.float64)
    block = 256 if qtype in (quant.Q4_K, quant.Q5_K, quant.Q6_K) else 32
    b = x.reshape(x.shape[0], -1, block).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def check_product(w: QuantWeight, x: torch.Tensor, y: torch.Tensor) -> None:
    wd = gguf_dequant(w).astype(np.float64)
    if w.qtype != quant.F32 and x.shape[0] >= quant.many_rows(w.qtype):  # dequantized tiles
        ref = x.numpy().astype(np.float64) @ wd.T
        scale = np.abs(x.numpy()) @ np.abs(wd).T
        amx = quant.uses_amx(w) and x.shape[0] < quant.AMX_MAX_ROWS
        bf16 = amx or quant.tile_dtype() == torch.bfloat16
        tol = 8e-3 if bf16 else 1e-5  # bf16: 2^-8 per product
        err = np.abs(y.numpy() - ref)
        assert (err <= tol * scale).all(), f"{w.type_name}: worst {(err / scale).max():.2e}"
        return
    xh = emulate_activations(x.numpy(), w.qtype)
    ref, scale = xh @ wd.T, np.abs(xh) @ np.abs(wd).T
    err = np.abs(y.numpy() - ref)
    assert (err <= 1e-5 * scale + 1e-30).all(), f"{w.type_name}: worst {(err / scale).max():.2e}"
    full = x.numpy().astype(np.float64) @ wd.T
    assert np.linalg.norm(y.numpy() - full) <= 0.015 * np.linalg.norm(full)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=quant.type_name)
def test_dequantize_is_exactly_gguf_py(qtype: int, path: str) -> None:
    rng = np.random.default_rng(qtype)
    w = random_weight(qtype, 9, 512, rng)
    ref = gguf_dequant(w)
    got = quant.dequantize(w)
    assert got.dtype == torch.float32 and got.shape == (9, 512)
    np.testing.assert_array_equal(got.numpy(), ref)
    ids = torch.tensor([7, 0, 7, 3])
    np.testing.assert_array_equal(quant.dequantize_rows(w, ids).numpy(), ref[[7, 0, 7, 3]])
    # bfloat16 tiles (the many-row path): torch's own rounding of the exact values
    bf = quant.dequantize_rows(w, ids, torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf, torch.from_numpy(ref[[7, 0, 7, 3]]).bfloat16())


def use_product(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """quant_matmul's product for many rows: the int8 kernels, AMX or torch on dequantized
    tiles"""
    if mode == "int8":
        monkeypatch.setattr(quant, "many_rows", lambda qtype=None: 10**9)
    elif mode == "amx":
        if not quant.amx_available():
            pytest.skip("this CPU (or its kernel) gives no AMX-BF16")
        assert quant.many_rows() == quant.MANY_ROWS_AMX
    else:
        monkeypatch.setattr(quant, "uses_amx", lambda w: False)
        dtype = torch.float32 if mode == "tiles-f32" else torch.bfloat16
        monkeypatch.setattr(quant, "tile_dtype", lambda: dtype)
        monkeypatch.setattr(quant, "many_rows", lambda qtype=None: 16)
        monkeypatch.setattr(quant, "_TILE_ELEMS", 576 * 10)  # several tiles, one ragged


PRODUCTS = [("int8", r) for r in (1, 2, 7, 16, 33, 64)] + [
    ("tiles-f32", 16), ("tiles-f32", 33), ("tiles-bf16", 16), ("tiles-bf16", 64),
    ("amx", 16), ("amx", 33), ("amx", 64)]


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=quant.type_name)
@pytest.mark.parametrize(("mode", "rows"), PRODUCTS)
def test_product_matches_gguf_dequantized_float_product(
        qtype: int, mode: str, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    use_product(mode, monkeypatch)
    rng = np.random.default_rng(100 * qtype + rows)
    inn = 512 if qtype in (quant.Q4_K, quant.Q5_K, quant.Q6_K) else 576
    w = random_weight(qtype, 37, inn, rng)  # 37: a ragged count of output rows
    x = torch.from_numpy(rng.standard_normal((rows, inn)).astype(np.float32))
    check_product(w, x, quant.quant_matmul(x, w))


@pytest.mark.parametrize("qtype", [quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q8_0, quant.BF16],
                         ids=quant.type_name)
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_weights_quantized_by_gguf_py(qtype: int, rows: int) -> None:
    # real quantized values (gguf-py's quantizer) rather than random bytes
    rng = np.random.default_rng(qtype + rows)
    wf = (rng.standard_normal((100, 1536)) * 0.05).astype(np.float32)
    data = np.ascontiguousarray(gguf.quants.quantize(wf, GQ(qtype))).view(np.uint8)
    w = QuantWeight(qtype, torch.from_numpy(data.reshape(100, -1).copy()), 1536, 100)
    x = torch.from_numpy(rng.standard_normal((rows, 1536)).astype(np.float32))
    check_product(w, x, quant.quant_matmul(x, w))


@pytest.mark.parametrize("qtype", [quant.Q4_0, quant.Q8_0, quant.Q5_0, quant.F16])
@pytest.mark.parametrize("rows", [5, 40])  # the dot products; many rows (AMX where it runs)
def test_model_shapes_with_bias_and_strided_rows(qtype: int, rows: int, path: str) -> None:
    rng = np.random.default_rng(7)
    w = random_weight(qtype, 1536, 576, rng)
    x = torch.from_numpy(rng.standard_normal((rows, 700)).astype(np.float32))[:, 100:676]
    bias = torch.from_numpy(rng.standard_normal(1536).astype(np.float32))
    y = quant.quant_matmul(x, w, bias)
    check_product(w, x.contiguous(), y - bias)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=quant.type_name)
def test_a_rows_product_does_not_depend_on_the_other_rows(qtype: int, path: str) -> None:
    # below many_rows() a row's result is the same bits alone or in any batch
    rng = np.random.default_rng(qtype + 3000)
    inn = 512 if qtype in (quant.Q4_K, quant.Q5_K, quant.Q6_K) else 576
    w = random_weight(qtype, 13, inn, rng)
    rows = min(quant.many_rows(qtype) - 1, 70)  # lanes: every round, here 8 groups and 6
    x = torch.from_numpy(rng.standard_normal((rows, inn)).astype(np.float32))
    together = quant.quant_matmul(x, w)
    for r in (0, 2, 5, x.shape[0] - 1):
        assert torch.equal(quant.quant_matmul(x[r:r + 1], w)[0], together[r])
        assert torch.equal(quant.quant_matmul(x[r:r + 3], w)[0], together[r])


def native_product(x: torch.Tensor, w: QuantWeight) -> torch.Tensor:
    """ferry_qmatmul itself (never AMX tiles or torch's: quant_matmul's many-row choices)."""
    y = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    cw = quant._c(w)
    assert native.loaded().ferry_qmatmul(x.data_ptr(), x.shape[0], x.stride(0),
                                         ctypes.addressof(cw), None, y.data_ptr(),
                                         w.out_features) == 0
    return y


@pytest.mark.parametrize("qtype", [quant.Q8_0, quant.Q4_1, quant.Q5_0, quant.Q4_K, quant.Q6_K],
                         ids=quant.type_name)
def test_a_row_of_a_long_product_is_the_same_bits(qtype: int, path: str) -> None:
    # 203 rows of 1024 values: the lanes take them in blocks that stay in the L2 cache (25
    # groups, a half group of 3), each chunk of W over one block at a time
    rng = np.random.default_rng(qtype + 4000)
    w = random_weight(qtype, 24, 1024, rng)
    x = torch.from_numpy(rng.standard_normal((203, 1024)).astype(np.float32))
    together = native_product(x, w)
    for r in (0, 7, 64, 131, 199, 202):
        assert torch.equal(native_product(x[r:r + 1], w)[0], together[r])
        assert torch.equal(native_product(x[r:r + 9], w)[0], together[r])


def exact_activations(rows: int, inn: int, rng: np.random.Generator) -> np.ndarray:
    """Integers times 2^-3 with max |value| 127 * 2^-3 in every block of 256 (so of 32 too):
    the kernels' int8 activations are these integers exactly."""
    q = rng.integers(-127, 128, (rows, inn // 32, 32))
    q[:, :, 0] = np.where(rng.random((rows, inn // 32)) < 0.5, -127, 127)
    return (q.reshape(rows, inn) / 8).astype(np.float32)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=quant.type_name)
@pytest.mark.parametrize("rows", [6, 21])  # 21: two groups of 8 in lanes, 5 in a partial one
def test_paths_agree_bit_for_bit_where_floats_are_exact(qtype: int, rows: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if quant.kernel_path() == "torch":
        pytest.skip(native.status())
    monkeypatch.setattr(quant, "many_rows", lambda qtype=None: 10**9)
    rng = np.random.default_rng(qtype + 1000)
    w = random_weight(qtype, 19, 512, rng, exact=True)
    x = torch.from_numpy(exact_activations(rows, 512, rng))
    exact = x.numpy().astype(np.float64) @ gguf_dequant(w).astype(np.float64).T
    got = on_every_path(x, w)
    for name, y in got.items():
        np.testing.assert_array_equal(y, exact.astype(np.float32), err_msg=name)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=quant.type_name)
@pytest.mark.parametrize("rows", [1, 7, 35])
def test_paths_agree_on_random_blocks(qtype: int, rows: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "many_rows", lambda qtype=None: 10**9)
    rng = np.random.default_rng(qtype + 2000 + rows)
    w = random_weight(qtype, 21, 1024, rng)
    x = torch.from_numpy(rng.standard_normal((rows, 1024)).astype(np.float32))
    got = on_every_path(x, w)
    if len(got) < 2:
        pytest.skip("this CPU runs one native path only")
    scale = np.abs(x.numpy()) @ np.abs(gguf_dequant(w)).T
    for name, y in got.items():
        assert (np.abs(y - got["plain"]) <= 2e-6 * scale).all(), name
    if "avx-vnni" in got:  # the same float steps as AVX2, only the integer instruction differs
        np.testing.assert_array_equal(got["avx-vnni"], got["avx2"])
    if "avx512-vnni" in got and qtype in BLOCK_TYPES:  # so too AVX-512's dot products
        np.testing.assert_array_equal(got["avx512-vnni"], got["avx2"])


@pytest.mark.parametrize("qtype", quant.QUANTIZABLE, ids=quant.type_name)
def test_quantize_is_bit_identical_to_gguf_py(qtype: int) -> None:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((70, 320)).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block
    w[4, 32:64] = 0.5  # ties in the largest magnitude
    w[5, 5] = 1e-6
    got = quant.quantize(torch.from_numpy(w), qtype)
    ref = gguf.quants.quantize(w, GQ(qtype))
    assert got.qtype == qtype and got.out_features == 70 and got.in_features == 320
    np.testing.assert_array_equal(got.data.numpy(), ref)
    # and from bf16 weights (as a safetensors checkpoint holds them)
    wb = torch.from_numpy(w).bfloat16()
    ref_b = gguf.quants.quantize(wb.float().numpy(), GQ(qtype))
    np.testing.assert_array_equal(quant.quantize(wb, qtype).data.numpy(), ref_b)


def test_torch_fallback_without_native_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "_lib", lambda: None)
    monkeypatch.setattr(quant, "_TILE_ELEMS", 576 * 10)  # several tiles, one ragged
    rng = np.random.default_rng(11)
    assert quant.kernel_path() == "torch"
    for qtype in (quant.Q4_K, quant.Q8_0, quant.BF16):
        inn = 512 if qtype == quant.Q4_K else 576
        w = random_weight(qtype, 37, inn, rng)
        x = torch.from_numpy(rng.standard_normal((3, inn)).astype(np.float32))
        ref = x.numpy().astype(np.float64) @ gguf_dequant(w).astype(np.float64).T
        np.testing.assert_allclose(quant.quant_matmul(x, w).numpy(), ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(quant.dequantize_rows(w, torch.tensor([2, 1])).numpy(),
                                      gguf_dequant(w)[[2, 1]])
    wf = rng.standard_normal((8, 64)).astype(np.float32)
    np.testing.assert_array_equal(quant.quantize(torch.from_numpy(wf), quant.Q4_0).data.numpy(),
                                  gguf.quants.quantize(wf, GQ.Q4_0))


def test_f32_weight_at_an_unaligned_offset() -> None:
    # a GGUF view may start anywhere: torch cannot view those bytes as floats, the C dots can
    rng = np.random.default_rng(3)
    wf = rng.standard_normal((5, 64)).astype(np.float32)
    raw = torch.zeros(5 * 256 + 2, dtype=torch.uint8)
    raw[2:2 + 5 * 256] = torch.from_numpy(wf.view(np.uint8).reshape(-1))
    w = QuantWeight(quant.F32, raw[2:].view(5, 256), 64, 5)
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    np.testing.assert_allclose(quant.quant_matmul(x, w).numpy(), x.numpy() @ wf.T, rtol=1e-5,
                               atol=1e-5)


def test_names_sizes_and_refusals() -> None:
    assert quant.type_name(quant.Q4_K) == "Q4_K" and quant.supported(quant.Q6_K)
    assert not quant.supported(int(GQ.Q2_K)) and "Q2_K" in quant.type_name(int(GQ.Q2_K))
    assert quant.row_bytes(quant.Q4_0, 576) == 18 * 18
    assert quant.row_bytes(quant.Q6_K, 512) == 2 * 210
    assert quant.row_bytes(quant.F16, 7) == 14
    with pytest.raises(ValueError, match=r"Q4_K.*256.*576"):
        quant.row_bytes(quant.Q4_K, 576)
    with pytest.raises(ValueError, match="Q2_K"):
        quant.row_bytes(int(GQ.Q2_K), 256)
    with pytest.raises(ValueError, match="type 99"):
        QuantWeight(99, torch.zeros(1, 1, dtype=torch.uint8), 32, 1)
    with pytest.raises(ValueError, match=r"Q8_0.*\[4, 34\]"):
        QuantWeight(quant.Q8_0, torch.zeros(4, 33, dtype=torch.uint8), 32, 4)
    with pytest.raises(ValueError, match="uint8"):
        QuantWeight(quant.Q8_0, torch.zeros(4, 34, dtype=torch.int8), 32, 4)
    w = random_weight(quant.Q8_0, 4, 64, np.random.default_rng(0))
    assert w.nbytes == 4 * 68
    with pytest.raises(ValueError, match=r"float32 \[rows, 64\]"):
        quant.quant_matmul(torch.zeros(2, 32), w)
    with pytest.raises(ValueError, match="float32"):
        quant.quant_matmul(torch.zeros(2, 64, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="bias"):
        quant.quant_matmul(torch.zeros(2, 64), w, torch.zeros(3))
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 4\)"):
        quant.dequantize_rows(w, torch.tensor([4]))
    with pytest.raises(ValueError, match="Q8_0 or Q4_0"):
        quant.quantize(torch.zeros(4, 256), quant.Q4_K)
    with pytest.raises(ValueError, match="32 values"):
        quant.quantize(torch.zeros(4, 40), quant.Q8_0)
    assert quant.quant_matmul(torch.zeros(0, 64), w).shape == (0, 4)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=quant.type_name)
@pytest.mark.parametrize(("out", "inn"), [(13, 32), (29, 160)])  # one block, five; ragged
def test_every_row_count_matches_one_row_at_a_time(qtype: int, out: int, inn: int,
                                                   path: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """1..40 rows through the native kernels (groups of 8 in lanes where the type has them,
    the rest one dot product per row group): each row the same bits as alone, and within the
    product's tolerance of the dequantized float reference."""
    monkeypatch.setattr(quant, "many_rows", lambda qtype=None: 10**9)
    if qtype in (quant.Q4_K, quant.Q5_K, quant.Q6_K):
        inn = 256 * (inn // 32)
    rng = np.random.default_rng(qtype * 7 + out)
    w = random_weight(qtype, out, inn, rng)
    x = torch.from_numpy(rng.standard_normal((40, inn)).astype(np.float32))
    alone = torch.cat([quant.quant_matmul(x[r:r + 1], w) for r in range(40)])
    check_product(w, x, alone)
    for rows in range(1, 41):
        start = rows % 3
        part = x[start:start + rows] if start + rows <= 40 else x[:rows]
        lo = 0 if part.data_ptr() == x.data_ptr() else start
        assert torch.equal(quant.quant_matmul(part, w), alone[lo:lo + rows]), rows


def test_lanes_run_where_the_path_has_them(path: str) -> None:
    # the block types (K-quants too) in lanes on every SIMD path, nothing on plain C
    for qtype in ALL_TYPES:
        lanes = path != "plain" and qtype in BLOCK_TYPES
        assert quant.uses_lanes(qtype) == lanes, quant.type_name(qtype)
        if not quant._amx_in_force():
            assert (quant.many_rows(qtype) == quant.MANY_ROWS_LANES) == lanes


def test_c_and_python_agree_where_the_amx_kernel_takes_over(path: str) -> None:
    # C's fused layers (ferry_proj_product) and Python's quant_matmul must pick the same kernel
    # for every round size, or the two paths' bits part
    lib = native.library()
    assert lib is not None
    for qtype in ALL_TYPES:
        if qtype == quant.F32:
            continue
        w = quant.QuantWeight(qtype, torch.zeros(4, quant.row_bytes(qtype, 256),
                                                 dtype=torch.uint8), 256, 4)
        cw = quant._c(w)
        for rows in range(1, 40):
            amx = quant.uses_amx(w) and rows >= quant.many_rows(qtype)
            assert bool(lib.ferry_qgemm_takes(ctypes.byref(cw), rows)) == amx, (
                quant.type_name(qtype), rows)


@pytest.mark.parametrize("qtype", [quant.Q4_0, quant.Q4_1], ids=quant.type_name)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_lanes_at_the_extremes_of_their_16_bit_sums(qtype: int, sign: float,
                                                    path: str) -> None:
    """Every nibble 15 against activations of one magnitude (all quantized to +-127): the
    lanes' 16-bit sums of a block reach their largest (8 * 2 * 15 * 127) and must equal the
    exact products, as the one-row dot products give them."""
    out, inn = 3, 64
    scale = np.float16(0.5).tobytes()
    rows = []
    for _ in range(out):
        block = scale + (np.float16(0.0).tobytes() if qtype == quant.Q4_1 else b"") + \
            b"\xff" * 16
        rows.append(np.frombuffer(block * (inn // 32), dtype=np.uint8))
    w = QuantWeight(qtype, torch.from_numpy(np.stack(rows).copy()), inn, out)
    x = torch.full((16, inn), sign)
    want = quant.dequantize(w) @ x[0]  # every weight 0.5 * (15 - 8) or 0.5 * 15
    got = quant.quant_matmul(x, w)
    assert torch.equal(got, want.expand(16, out)), (got[0], want)


def _k_block_at_most(qtype: int) -> bytes:
    """A K-quant block whose every value is its largest (Q4_K 15, Q5_K 31, Q6_K 63 before its
    -32), every scale 1, the mins 0 and d 0.5."""
    d, zero = np.float16(0.5).tobytes(), np.float16(0.0).tobytes()
    if qtype == quant.Q6_K:  # ql, qh, int8 scales, d
        return b"\xff" * 128 + b"\xff" * 64 + b"\x01" * 16 + d
    # scales 0-3 and (low nibbles of bytes 8-11) 4-7 are 1; mins 0
    scales = b"\x01" * 4 + b"\x00" * 4 + b"\x01" * 4
    high = b"\xff" * 32 if qtype == quant.Q5_K else b""
    return d + zero + scales + high + b"\xff" * 128


@pytest.mark.parametrize("qtype", [quant.Q4_K, quant.Q5_K, quant.Q6_K], ids=quant.type_name)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_k_lanes_at_the_extremes_of_their_16_bit_sums(qtype: int, sign: float,
                                                      path: str) -> None:
    """Every value at its largest against activations all quantized to +-127: the AVX2 lanes'
    16-bit sums (8 products of Q4_K, 4 of Q5_K, 2 of Q6_K added before widening) reach their
    largest, and 16 rows in lanes must give one row's dot-product bits, close to the float
    product."""
    out, inn = 3, 512
    row = np.frombuffer(_k_block_at_most(qtype) * (inn // 256), dtype=np.uint8)
    w = QuantWeight(qtype, torch.from_numpy(np.stack([row] * out).copy()), inn, out)
    x = torch.full((16, inn), sign)
    want = quant.dequantize(w) @ x[0]  # every weight 0.5 * 15, 0.5 * 31 or 0.5 * 31
    got = quant.quant_matmul(x, w)
    assert torch.equal(got, quant.quant_matmul(x[:1], w).expand(16, out)), (got[0], want)
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=0)

"""Ferry's fused CPU kernels (engine/kernels) against the torch ops they replace.

float32 results must match to rounding; bfloat16 ones must round exactly as the torch ops do
(norm as Hugging Face's LlamaRMSNorm, silu then multiply, x*cos + roll(x)*sin), so turning the
kernels on does not change a bf16 model's tokens. Attention is checked against the gathered
torch path over shuffled, partly filled pages.
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from engine.execution.attention.base import AttentionInputs
from engine.execution.attention.torch_backend import TorchAttention
from engine.execution.kv_pool import KVPool
from engine.execution.model.config import RopeSpec
from engine.execution.model.layers import RotaryEmbedding
from engine.kernels import native, ops

DTYPES = [torch.float32, torch.bfloat16]


pytestmark = pytest.mark.usefixtures("native_kernels")


def test_kernels_build_where_a_compiler_exists() -> None:
    # guards against the whole module silently skipping on a machine that can build them
    if shutil.which("cc") or shutil.which("gcc"):
        assert native.library() is not None, native.status()
        assert native.status().startswith("native")


def hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7])
def test_rms_norm_and_fused_residual_add(dtype: torch.dtype, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x, res = (torch.randn(rows, 96, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.3 * torch.randn(96, generator=g)).to(dtype)
    exact = dtype == torch.bfloat16  # same roundings -> same bits
    tol = {"atol": 0, "rtol": 0} if exact else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), hf_rms_norm(x, w, 1e-5), **tol)
    summed = res + x
    running = res.clone()
    out = ops.rms_norm(x, w, 1e-5, running)
    assert torch.equal(running, summed)  # the residual is updated in place
    torch.testing.assert_close(out, hf_rms_norm(summed, w, 1e-5), **tol)


def test_rms_norm_rejects_a_mismatched_residual() -> None:
    with pytest.raises(ValueError, match="residual"):
        ops.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6, torch.randn(3, 8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_norm_in_place_on_strided_rows(dtype: torch.dtype) -> None:
    # QK-norm on q's columns of a fused qkv: each head vector as rms_norm and Hugging Face's
    # norm make it, the other columns untouched; enough rows to split over the team
    g = torch.Generator().manual_seed(3)
    heads, d, t = 6, 64, 40
    rows = torch.randn(t, (heads + 3) * d, generator=g).to(dtype)
    x = rows[:, :heads * d].view(t, heads, d)
    w = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    before = x.clone()
    untouched = rows[:, heads * d:].clone()
    ops.head_norm_(x, w, 1e-6)
    assert torch.equal(x, ops.rms_norm(before.view(t * heads, d), w, 1e-6).view(t, heads, d))
    tol = {"atol": 0, "rtol": 0} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(x, hf_rms_norm(before, w, 1e-6), **tol)
    assert torch.equal(rows[:, heads * d:], untouched)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_activations(dtype: torch.dtype, act: str) -> None:
    # wide values (exp's range reduction) and an odd width (the vector loop's scalar tail)
    gate_up = (4 * torch.randn(64, 2 * 515, generator=torch.Generator().manual_seed(1))).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    if act == "silu":
        expected, got = F.silu(gate) * up, ops.silu_and_mul(gate_up)
    else:
        expected, got = F.gelu(gate, approximate="tanh") * up, ops.gelu_tanh_and_mul(gate_up)
    if dtype == torch.bfloat16 and act == "silu":
        assert torch.equal(got, expected)
    elif dtype == torch.bfloat16:  # torch's tanh and Ferry's exp may round the last bf16 bit
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=2 ** -7)
    else:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_on_strided_rows(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    heads, d, t = 5, 32, 6
    rows = torch.randn(t, (heads + 2) * d, generator=g).to(dtype)  # like qkv: rotate the front
    x = rows[:, :heads * d].view(t, heads, d)
    rope = RotaryEmbedding(d, 512, RopeSpec(10000.0))
    cos, sin = rope(torch.tensor([0, 3, 9, 100, 101, 511]), dtype)
    expected = torch.addcmul(x * cos, torch.roll(x, d // 2, dims=-1), sin)
    untouched = rows[:, heads * d:].clone()
    ops.rotary(x, cos, sin)
    if dtype == torch.bfloat16:
        assert torch.equal(x, expected)
    else:
        torch.testing.assert_close(x, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(rows[:, heads * d:], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_matches_pool_write(dtype: torch.dtype) -> None:
    a, b = (KVPool(1, 8, 4, 2, 16, dtype, "cpu") for _ in range(2))
    qkv = torch.randn(5, (3 + 4) * 16).to(dtype)
    kv = qkv[:, 3 * 16:].view(5, 2, 2, 16)  # strided token rows, as the model passes them
    slots = torch.tensor([0, 5, 31, 17, 12])
    a.write(0, a.locate(slots), kv)
    ops.store_kv(kv, slots, b.paged(0))
    assert torch.equal(a.data, b.data)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 16])
@pytest.mark.parametrize(("n_in", "n_out", "bias"), [(64, 96, False), (48, 37, True),
                                                     (40, 21, True)])
def test_gemv_bf16_matches_a_wide_reference(rows: int, n_in: int, n_out: int,
                                            bias: bool) -> None:
    # 48 x 37: a tail of weight rows outside the 4/2-row blocks; 40: not a multiple of 16,
    # so the plain loop computes everything
    g = torch.Generator().manual_seed(rows * n_in)
    x = torch.randn(rows, n_in, generator=g).bfloat16()
    w = torch.randn(n_out, n_in, generator=g).bfloat16()
    b = torch.randn(n_out, generator=g).bfloat16() if bias else None
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = ops.gemv_bf16(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n_out)
    # accumulated in float32 and rounded once: within one bf16 rounding of the exact result
    torch.testing.assert_close(got.double(), ref, atol=1e-3, rtol=2 ** -8)


def test_gemv_bf16_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="gemv_bf16"):
        ops.gemv_bf16(torch.ones(2, 8).bfloat16(), torch.ones(3, 9).bfloat16())


def test_bf16_model_fixes_its_products_at_load(tiny_models, make_harness) -> None:
    from engine.execution.model import linear_kernels
    from engine.execution.model.layers import Linear

    model = make_harness(tiny_models["llama"].path, dtype=torch.bfloat16).executor.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears
    for m in linears:
        assert m.product is not linear_kernels.linear  # fixed at load, not chosen per call
        if linear_kernels.emulated_bf16(m.weight.dtype, m.weight.device):
            assert linear_kernels.direct_rows(m.weight) == linear_kernels.NATIVE_DIRECT_ROWS
            x = torch.randn(3, m.weight.shape[1]).bfloat16()
            assert torch.equal(m(x), ops.gemv_bf16(x, m.weight, m.bias))


def _attention_case(dtype: torch.dtype, kv_lens: list[int], heads: int, kv_heads: int,
                    seed: int, d: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(native, torch) decode attention outputs for one round over the same pool."""
    rng = random.Random(seed)
    ps = 4
    num_pages = sum(-(-n // ps) + 1 for n in kv_lens)
    pool = KVPool(1, num_pages, ps, kv_heads, d, dtype, "cpu")
    pool.data.normal_(generator=torch.Generator().manual_seed(seed))
    free = list(range(num_pages))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // ps) + rng.randrange(2))] for n in kv_lens]
    slots = torch.tensor([t[(n - 1) // ps] * ps + (n - 1) % ps for t, n in zip(tables, kv_lens)])
    # seeded: drawn from the global generator, the inputs (and whether bf16 stays within
    # the tolerance; about 1 draw in 400 did not) depended on the tests run before
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(kv_lens), heads, d, generator=gen).to(dtype)
    kv = torch.randn(len(kv_lens), 2, kv_heads, d, generator=gen).to(dtype)
    outs = []
    for use_native in (True, False):
        attn = TorchAttention(pool, heads, kv_heads, d, d ** -0.5)
        attn.native = use_native
        attn.prepare(AttentionInputs([1] * len(kv_lens), kv_lens, tables, slots))
        outs.append(attn.forward(q, kv, 0))
    return outs[0], outs[1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "d"),
                         [(4, 4, 16), (6, 2, 16), (3, 1, 16), (9, 3, 64), (4, 2, 128), (2, 1, 40),
                          (10, 2, 96), (5, 1, 36)])
def test_decode_attention_matches_torch(dtype: torch.dtype, heads: int, kv_heads: int,
                                        d: int) -> None:
    # head sizes that are multiples of 8 take the vector path (40 and 96 also its one-vector
    # tail), 36 the plain one; groups of 1-5 query heads fill blocks of 4 rows or leave a rest
    got, ref = _attention_case(dtype, [1, 4, 5, 23, 64, 9], heads, kv_heads, seed=heads, d=d)
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: one rounding of the output
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 36])
def test_decode_attention_over_long_contexts(dtype: torch.dtype, d: int) -> None:
    # hundreds of pages per sequence, lengths off the 8-position blocks, a short one beside
    got, ref = _attention_case(dtype, [512, 513, 1500, 7], 6, 2, seed=d, d=d)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


def test_decode_attention_rejects_pages_outside_the_pool() -> None:
    with pytest.raises(ValueError, match="outside the KV pool"):
        ops.DecodePages([[0, 99]], [6], 4, num_pages=8)
    with pytest.raises(ValueError, match="need 2 pages"):
        ops.DecodePages([[0]], [6], 4, num_pages=8)


def test_prepare_rejects_slots_outside_the_pool() -> None:
    pool = KVPool(1, 4, 4, 1, 8, torch.float32, "cpu")
    attn = TorchAttention(pool, 2, 1, 8, 0.3)
    assert attn.native
    with pytest.raises(ValueError, match="outside the KV pool"):
        attn.prepare(AttentionInputs([1], [3], [[0]], torch.tensor([16])))


def _status_in_subprocess(env: dict[str, str]) -> str:
    code = "from engine.kernels import native; print(native.status())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=True)
    return done.stdout.strip()


def test_switched_off_and_unbuildable_kernels_fall_back(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    assert _status_in_subprocess({"FERRY_NATIVE_KERNELS": "0"}).startswith("off")
    # a compiler that fails: a clear reason, and callers keep the torch path
    status = _status_in_subprocess({"CC": "false", "TMPDIR": str(tmp_path / "a")})
    assert status.startswith("unavailable"), status


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership bits")
def test_kernels_are_not_loaded_from_a_folder_others_can_write(tmp_path) -> None:
    shared = tmp_path / f"ferry-kernels-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could have planted a library here
    status = _status_in_subprocess({"TMPDIR": str(tmp_path)})
    assert status.startswith("unavailable") and "not private" in status, status
    assert not list(shared.iterdir())  # nothing built or loaded there


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_matches_torch_with_ties_infinities_and_nan(dtype: torch.dtype) -> None:
    logits = torch.randn(6, 1003, generator=torch.Generator().manual_seed(5))
    logits[1, [7, 300, 999]] = 50.0  # a tie: the first one wins
    logits[2] = float("-inf")
    logits[2, 500] = -1e30
    logits[3] = float("-inf")  # all -inf: index 0, as torch
    logits[4, [10, 20]] = float("nan")  # NaN counts as the maximum, as in torch
    logits[5, -1] = float("inf")
    logits = logits.to(dtype)
    assert ops.argmax(logits) == logits.argmax(dim=-1).tolist()


# --- the C declarations: read once from the headers -----------------------------------------

def test_every_header_prototype_is_bound_with_its_declared_types() -> None:
    lib = native.library()
    decls = native.declarations()
    assert {"ferry_rms_norm", "ferry_decode_layers", "ferry_qmatmul"} <= decls.functions.keys()
    for fn in decls.functions.values():
        bound = getattr(lib, fn.name)
        assert bound.argtypes == fn.argtypes and bound.restype == fn.restype, fn.name
    norm = decls.functions["ferry_rms_norm"]
    assert norm.restype is ctypes.c_int
    assert norm.argtypes == [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int,
                                                      ctypes.c_float, ctypes.c_int]


def test_struct_layouts_match_the_c_compiler(tmp_path) -> None:
    # the ctypes Structures come from the headers; the compiler must lay them out the same
    cc = native._compiler()
    if cc is None:
        pytest.skip("no C compiler")
    structs = native.declarations().structs
    lines = []
    for name, st in structs.items():
        lines.append(f'printf("{name} %zu\\n", sizeof({name}));')
        for field, _ in st._fields_:
            lines.append(f'printf("{name}.{field} %zu\\n", offsetof({name}, {field}));')
    src = tmp_path / "layout.c"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "kernels.h"\n'
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{native.CSRC}", str(src), "-o", str(exe), "-lm"],
                   check=True, capture_output=True, timeout=120)
    got = dict(line.split() for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.splitlines())
    want = {}
    for name, st in structs.items():
        want[name] = str(ctypes.sizeof(st))
        for field, _ in st._fields_:
            want[f"{name}.{field}"] = str(getattr(st, field).offset)
    assert got == want
    assert {"ferry_layer", "ferry_dims", "ferry_weight", "ferry_proj"} <= structs.keys()


def test_cdecl_reads_prototypes_structs_and_refuses_unknown_types(tmp_path) -> None:
    from engine.kernels import cdecl

    (tmp_path / "a.h").write_text(
        "/* int ferry_commented(void); */\n#include <stdint.h>\n"
        "typedef struct { int32_t kind, pad; const void *data; float v[3]; } ferry_part;\n"
        "typedef struct { int internal; } not_shared;\n"
        "static inline int ferry_helper(int a) { return ferry_other(a); }\n"
        "void ferry_go(const ferry_part *p, int64_t n, float scale, double d);\n"
        "int64_t ferry_count(void);\n")
    (tmp_path / "b.h").write_text('#include "a.h"\n'
                                  "typedef struct { ferry_part parts[2]; } ferry_whole;\n")
    decls = cdecl.parse([tmp_path / "b.h", tmp_path / "a.h"])  # include order, not list order
    assert set(decls.functions) == {"ferry_go", "ferry_count"}
    go = decls.functions["ferry_go"]
    assert go.restype is None and go.argtypes == [ctypes.c_void_p, ctypes.c_int64,
                                                  ctypes.c_float, ctypes.c_double]
    assert decls.functions["ferry_count"].argtypes == []
    part = decls.structs["ferry_part"]
    assert [f for f, _ in part._fields_] == ["kind", "pad", "data", "v"]
    assert ctypes.sizeof(part) == 4 + 4 + 8 + 12 + 4  # padded to pointer alignment
    assert ctypes.sizeof(decls.structs["ferry_whole"]) == 2 * ctypes.sizeof(part)
    assert "not_shared" not in decls.structs
    (tmp_path / "c.h").write_text("void ferry_bad(long double x);\n")
    with pytest.raises(ValueError, match=r"c\.h: C type 'long double'"):
        cdecl.parse([tmp_path / "c.h"])


def test_a_failed_allocation_is_an_error_not_a_crash() -> None:
    lib = native.library()
    out = torch.zeros(1, dtype=torch.int64)
    # a row of 2**61 logits cannot be allocated: the kernel returns before reading anything
    assert lib.ferry_argmax(None, 1, 2 ** 61, 0, out.data_ptr()) == -1
    assert lib.ferry_gemv_bf16(None, None, None, None, 1, 2 ** 59, 1) == -1
    with pytest.raises(MemoryError, match="argmax"):
        ops.check(-1, "argmax")


# --- 16-bit KV pools under float32 or bf16 activations ---------------------------------------

@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("pool_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_store_kv_rounds_into_the_pool_dtype_as_torch(act: torch.dtype,
                                                      pool_dtype: torch.dtype) -> None:
    a, b = (KVPool(1, 8, 4, 2, 16, pool_dtype, "cpu") for _ in range(2))
    qkv = (3 * torch.randn(5, 7 * 16, generator=torch.Generator().manual_seed(3))).to(act)
    # f16 edge cases: subnormal, overflow to inf, below half the smallest subnormal, the
    # largest value that still rounds to a finite half
    qkv[0, 3 * 16:3 * 16 + 4] = torch.tensor([1e-6, 7e4, -2e-8, 65519.0])
    kv = qkv[:, 3 * 16:].view(5, 2, 2, 16)
    slots = torch.tensor([0, 5, 31, 17, 12])
    a.write(0, a.locate(slots), kv.to(pool_dtype))  # torch's rounding
    ops.store_kv(kv, slots, b.paged(0))
    assert torch.equal(a.data, b.data)


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("pool_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 40, 36])
def test_decode_attention_over_a_16_bit_pool(act: torch.dtype, pool_dtype: torch.dtype,
                                             d: int) -> None:
    # against the torch path in float32 over the same (rounded) K/V
    kv_lens, heads, kvh, ps = [1, 9, 23, 64], 6, 2, 4
    g = torch.Generator().manual_seed(d)
    num_pages = sum(-(-n // ps) for n in kv_lens)
    pool = KVPool(1, num_pages, ps, kvh, d, pool_dtype, "cpu")
    pool.data.copy_(torch.randn(pool.data.shape, generator=g))
    wide = KVPool(1, num_pages, ps, kvh, d, torch.float32, "cpu")
    wide.data.copy_(pool.data)
    tables, first = [], 0
    for n in kv_lens:
        tables.append(list(range(first, first + -(-n // ps))))
        first += len(tables[-1])
    slots = torch.tensor([t[(n - 1) // ps] * ps + (n - 1) % ps for t, n in zip(tables, kv_lens)])
    q = torch.randn(len(kv_lens), heads, d, generator=g).to(act)
    kv = torch.randn(len(kv_lens), 2, kvh, d, generator=g).to(act)
    inputs = AttentionInputs([1] * len(kv_lens), kv_lens, tables, slots)
    native_attn = TorchAttention(pool, heads, kvh, d, d ** -0.5)
    assert native_attn.native
    native_attn.prepare(inputs)
    got = native_attn.forward(q, kv, 0)
    ref_attn = TorchAttention(wide, heads, kvh, d, d ** -0.5)
    ref_attn.native = False
    ref_attn.prepare(inputs)
    ref = ref_attn.forward(q.float(), kv.to(pool_dtype).float(), 0)
    assert got.dtype == act
    assert torch.equal(wide.data.to(pool_dtype), pool.data)  # the new K/V stored alike
    tol = 1e-5 if act == torch.float32 else 8e-3
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16])
def test_short_prefill_parts_through_the_decode_kernel_match_sdpa(
        window: int | None, pool_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of decodes, a whole prompt, a chunk after a cached prefix and a speculative
    round's few rows: the prefill rows attended by the decode kernel (each row a sequence
    ending at its position) as SDPA attends them over the gathered pages, causal and within
    the window; above the bound the round goes to SDPA."""
    from engine.execution.attention import torch_backend

    rng, ps, heads, kvh, d = random.Random(7), 4, 6, 2, 64
    qlens, kvlens = [1, 1, 9, 6, 3], [5, 12, 9, 23, 40]
    num_pages = sum(-(-n // ps) for n in kvlens)
    pool = KVPool(1, num_pages, ps, kvh, d, pool_dtype, "cpu")
    pool.data.normal_(generator=torch.Generator().manual_seed(3))
    free = list(range(num_pages))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // ps))] for n in kvlens]
    slots = torch.tensor([t[p // ps] * ps + p % ps for t, q, n in zip(tables, qlens, kvlens)
                          for p in range(n - q, n)])
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(sum(qlens), heads, d, generator=gen)
    kv = torch.randn(sum(qlens), 2, kvh, d, generator=gen)
    inputs = AttentionInputs(qlens, kvlens, tables, slots)
    outs = {}
    for native_prefill in (True, False):
        # the bounds: every sequence under them, or none
        monkeypatch.setattr(torch_backend, "NATIVE_PREFILL_ROWS", 32 if native_prefill else 2)
        monkeypatch.setattr(torch_backend, "NATIVE_PREFILL_CONTEXT",
                            512 if native_prefill else 8)
        attn = TorchAttention(pool, heads, kvh, d, d ** -0.5, windows=[window])
        attn.prepare(inputs)
        assert (attn.plans[0].pre_pages is not None) == native_prefill
        outs[native_prefill] = attn.forward(q, kv, 0)
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("d", [64, 40, 36])
def test_a_prefill_rows_tile_gives_each_row_its_bits_alone(window: int, d: int) -> None:
    """Rows of one sequence given one shared table are attended as a tile (K/V widened once
    for all of them): each row's output is the same bits as the row attended alone, as a
    decode step of that length would attend it, also past a tile's 8 rows and with a window."""
    ps, heads, kvh, total, rows = 4, 6, 2, 45, 11
    num_pages = -(-total // ps)
    pool = KVPool(1, num_pages, ps, kvh, d, torch.float16, "cpu")
    pool.data.normal_(generator=torch.Generator().manual_seed(5))
    table = list(range(num_pages))
    random.Random(5).shuffle(table)
    lens = list(range(total - rows + 1, total + 1))
    q = torch.randn(rows, heads, d, generator=torch.Generator().manual_seed(6))
    tiled = ops.decode_attention(q, pool.paged(0),
                                 ops.DecodePages([table] * rows, lens, ps, num_pages),
                                 d ** -0.5, window)
    alone = torch.cat([ops.decode_attention(q[r:r + 1], pool.paged(0),
                                            ops.DecodePages([list(table)], [n], ps, num_pages),
                                            d ** -0.5, window)
                       for r, n in enumerate(lens)])
    assert torch.equal(tiled, alone)


@pytest.mark.parametrize(("heads", "d"), [(4, 256), (3, 40), (8, 64)])
def test_one_sequence_split_by_query_heads_keeps_its_bits(heads: int, d: int) -> None:
    """One chat's step on a model with one KV head is a single (sequence, KV head) item:
    its query heads are split over the threads (parts read the same K/V). Each head's output
    is the same bits as in a round of several sequences, where nothing is split."""
    ps, n = 4, 37
    others = [9, 20, 14]
    num_pages = sum(-(-k // ps) for k in [n, *others])
    pool = KVPool(1, num_pages, ps, 1, d, torch.float16, "cpu")
    pool.data.normal_(generator=torch.Generator().manual_seed(8))
    pages = list(range(num_pages))
    random.Random(8).shuffle(pages)
    tables, at = [], 0
    for k in [n, *others]:
        tables.append(pages[at:at + -(-k // ps)])
        at += -(-k // ps)
    q = torch.randn(1 + len(others), heads, d, generator=torch.Generator().manual_seed(9))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the split needs a team of two, whatever the machine has
    try:
        alone = ops.decode_attention(q[:1], pool.paged(0),
                                     ops.DecodePages(tables[:1], [n], ps, num_pages), d ** -0.5)
        batch = ops.decode_attention(q, pool.paged(0),
                                     ops.DecodePages(tables, [n, *others], ps, num_pages),
                                     d ** -0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, batch[:1])


def test_a_build_replaces_older_builds_for_its_cpu_target_only(tmp_path) -> None:
    names = ["ferry_kernels-native-0123456789abcdef.so", "ferry_kernels-native-fedcba9876543210.so",
             "ferry_kernels-avx-vnni-0123456789abcdef.so", "ferry_kernels-avx2-0123456789abcdef.so",
             "ferry_kernels-00112233aabbccdd.so"]  # the last: named before targets were
    for name in names:
        (tmp_path / name).touch()
    stale = native.stale_builds(tmp_path / "ferry_kernels-avx-vnni-aaaaaaaaaaaaaaaa.so")
    assert sorted(p.name for p in stale) == sorted([names[2], names[4]])
    stale = native.stale_builds(tmp_path / names[0])
    assert sorted(p.name for p in stale) == sorted([names[1], names[4]])


def test_the_app_shares_one_kernel_build_across_homes_when_asked(tmp_path) -> None:
    from app.paths import get_paths
    home = {"FERRY_HOME": str(tmp_path / "home")}
    assert get_paths(home).kernels_cache == tmp_path / "home" / "cache" / "kernels"
    shared = get_paths({**home, "FERRY_KERNEL_CACHE": str(tmp_path / "k")})
    assert shared.kernels_cache == tmp_path / "k" and shared.cache == tmp_path / "home" / "cache"

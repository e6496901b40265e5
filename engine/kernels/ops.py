"""Python entry points to the fused CPU kernels (csrc/); callers check `usable` first.

Each function takes and returns torch tensors, checks shapes only cheaply (they run ~300 times
per decode step, where microseconds count) and leaves the plain torch path to the caller.
Kernels that allocate return an error code: `check` turns it into MemoryError.
"""
from __future__ import annotations

import torch

from engine.kernels import native

# dt codes of csrc/ferry.h; the activations' kernels take float32 and bfloat16, the K/V ones
# (store_kv, decode_attention) float16 too
_DT = {torch.float32: 0, torch.bfloat16: 1}
POOL_DT = {**_DT, torch.float16: 2}
_ENOMEM = -1


def check(rc: int, name: str) -> None:
    if rc != 0:
        raise MemoryError(f"{name}: out of memory") if rc == _ENOMEM else RuntimeError(
            f"{name} failed with code {rc}")


def usable(t: torch.Tensor) -> bool:
    """The kernels can compute on `t`: a CPU float32/bfloat16 tensor, and they are loaded."""
    return t.device.type == "cpu" and t.dtype in _DT and native.library() is not None


def usable_pool(t: torch.Tensor) -> bool:
    """The K/V kernels (store_kv, decode_attention) can read and write the pool tensor `t`:
    on CPU, float32, bfloat16 or float16, and the kernels are loaded."""
    return t.device.type == "cpu" and t.dtype in POOL_DT and native.library() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """rms_norm(x) * weight over the last dim, or with `residual`: residual += x (in place)
    and the norm of that sum. x and residual contiguous [rows, dim]."""
    x = x.contiguous()
    out = torch.empty_like(x)
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    check(native.loaded().ferry_rms_norm(
        x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
        out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps, _DT[x.dtype]), "rms_norm")
    return out


def head_norm_(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """rms_norm(v) * weight for each head vector v of x [tokens, heads, dim], in place (tokens
    may be rows of a wider tensor: the q or k columns of a fused qkv; heads and dim
    contiguous). The same steps per vector as rms_norm."""
    t, heads, dim = x.shape
    if x.stride(2) != 1 or x.stride(1) != dim:
        raise ValueError("head_norm_: x must be [tokens, heads, dim] with contiguous heads")
    check(native.loaded().ferry_head_norm(x.data_ptr(), x.stride(0), t, heads, dim,
                                          weight.data_ptr(), eps, _DT[x.dtype]), "head_norm")


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate x [tokens, heads, dim] in place (tokens may be rows of a wider tensor; heads
    and dim contiguous) with the [tokens, 1, dim] tables of layers.RotaryEmbedding."""
    t, heads, dim = x.shape
    if x.stride(2) != 1 or x.stride(1) != dim or cos.shape[0] != t or sin.shape[0] != t:
        raise ValueError("rotary: x must be [tokens, heads, dim] with contiguous heads")
    check(native.loaded().ferry_rotary(x.data_ptr(), x.stride(0), t, heads, dim,
                                         cos.contiguous().data_ptr(),
                                         sin.contiguous().data_ptr(), _DT[x.dtype]), "rotary")


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2n] (gate | up) -> silu(gate) * up, [rows, n]."""
    return _gated(gate_up, "silu")


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2n] (gate | up) -> gelu_tanh(gate) * up, [rows, n] (Gemma)."""
    return _gated(gate_up, "gelu_tanh")


def _gated(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    rows, n2 = gate_up.shape
    out = gate_up.new_empty(rows, n2 // 2)
    fn = native.loaded().ferry_silu_mul if act == "silu" else native.loaded().ferry_gelu_tanh_mul
    check(fn(gate_up.data_ptr(), out.data_ptr(), rows, n2 // 2, _DT[gate_up.dtype]),
          f"{act}_and_mul")
    return out


def store_kv(kv: torch.Tensor, slots: torch.Tensor, paged: torch.Tensor) -> None:
    """kv [tokens, 2, kv_heads, dim] (token rows may be strided) into one layer of the pool,
    paged [pages, 2, kv_heads, page_size, dim], at int64 `slots` (rounded to the pool's dtype
    as torch's .to() rounds, where the two differ)."""
    _, _, kvh, ps, dim = paged.shape
    if kv.stride(1) != kvh * dim or kv.stride(2) != dim or kv.stride(3) != 1:
        raise ValueError("store_kv: kv must have contiguous [2, kv_heads, dim] token rows")
    native.loaded().ferry_store_kv(kv.data_ptr(), kv.stride(0), slots.data_ptr(),
                                    slots.shape[0], paged.data_ptr(), kvh, ps, dim,
                                    POOL_DT[kv.dtype], POOL_DT[paged.dtype])


class DecodePages:
    """One round's page tables for `decode_attention`, flattened once (not per layer).
    Consecutive entries given the very same table object (a prefill part's query rows, one
    entry each) share one copy of it, which the kernel takes as rows of one sequence."""

    def __init__(self, page_tables: list[list[int]], kv_lens: list[int], page_size: int,
                 num_pages: int) -> None:
        ids: list[int] = []
        starts: list[int] = []
        last: list[int] | None = None
        have = 0  # pages of `last` copied so far (the end of ids)
        for table, n in zip(page_tables, kv_lens):
            need = -(-n // page_size)
            if len(table) < need:
                raise ValueError(f"{n} positions need {need} pages, the table has {len(table)}")
            if table is last:
                starts.append(starts[-1])
            else:
                starts.append(len(ids))
                last, have = table, 0
            if need > have:
                ids.extend(table[have:need])
                have = need
        if ids and not (min(ids) >= 0 and max(ids) < num_pages):
            raise ValueError("a page table points outside the KV pool")
        self.page_ids = torch.tensor(ids, dtype=torch.int32)
        self.page_starts = torch.tensor(starts, dtype=torch.int64)
        self.kv_lens = torch.tensor(kv_lens, dtype=torch.int32)
        self.num = len(kv_lens)


def decode_attention(q: torch.Tensor, paged: torch.Tensor, pages: DecodePages,
                     scale: float, window: int | None = None) -> torch.Tensor:
    """q [seqs, heads, dim] (rows may be strided) attends over each sequence's cached K/V in
    `paged` (one layer of the pool, any of POOL_DT), its last `window` positions only where
    given (a sliding-window layer) -> [seqs, heads * dim] in q's dtype."""
    seqs, heads, dim = q.shape
    _, _, kvh, ps, _ = paged.shape
    if q.stride(2) != 1 or q.stride(1) != dim or seqs != pages.num:
        raise ValueError("decode_attention: q must be [seqs, heads, dim] with contiguous heads")
    out = q.new_empty(seqs, heads * dim)
    check(native.loaded().ferry_decode_attention(
        q.data_ptr(), q.stride(0), paged.data_ptr(), pages.page_ids.data_ptr(),
        pages.page_starts.data_ptr(), pages.kv_lens.data_ptr(), seqs, heads, kvh, dim, ps,
        scale, out.data_ptr(), POOL_DT[q.dtype], POOL_DT[paged.dtype], window or 0),
        "decode_attention")
    return out


def gemv_bf16(x: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ weight [out, in].T (+ bias), all bf16 -> [rows, out] bf16; meant for a
    few rows (linear_kernels decides how many)."""
    x = x.contiguous()
    rows, n_in = x.shape
    if rows < 1 or weight.shape[1] != n_in or not weight.is_contiguous():
        raise ValueError(f"gemv_bf16: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    out = x.new_empty(rows, weight.shape[0])
    check(native.loaded().ferry_gemv_bf16(x.data_ptr(), weight.data_ptr(),
                                            None if bias is None else bias.data_ptr(),
                                            out.data_ptr(), rows, n_in, weight.shape[0]),
           "gemv_bf16")
    return out


def argmax(logits: torch.Tensor) -> list[int]:
    """Row-wise argmax of [rows, vocab] logits (first maximum; first NaN if any)."""
    logits = logits.contiguous()
    rows, n = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    check(native.loaded().ferry_argmax(logits.data_ptr(), rows, n, _DT[logits.dtype],
                                         out.data_ptr()), "argmax")
    return out.tolist()


def encoder_attention(qkv: torch.Tensor, lengths: torch.Tensor, heads: int,
                      out_dtype: torch.dtype, max_len: int = 0) -> torch.Tensor:
    """Bidirectional attention of packed inputs: qkv [tokens, 3 * heads * dim] (q | k | v
    columns, float32 or bf16), the inputs one after another with int64 `lengths` (summing
    to tokens: the caller's to ensure, a sum here costs a torch op per layer); each token
    attends over its own input's tokens -> [tokens, heads * dim] in out_dtype. Inputs longer
    than `max_len` (> 0) are left out: their rows are left unwritten, for the caller."""
    qkv = qkv.contiguous()
    tokens, width = qkv.shape
    if width % (3 * heads) or lengths.dtype != torch.int64 or lengths.dim() != 1:
        raise ValueError(f"encoder_attention: qkv {tuple(qkv.shape)}, {heads} heads, "
                         f"lengths {lengths.dtype} {tuple(lengths.shape)}")
    dim = width // (3 * heads)
    out = torch.empty(tokens, heads * dim, dtype=out_dtype)
    check(native.loaded().ferry_encoder_attention(
        qkv.data_ptr(), _DT[qkv.dtype], lengths.data_ptr(), lengths.shape[0], max_len, heads,
        dim, dim ** -0.5, out.data_ptr(), _DT[out_dtype]), "encoder_attention")
    return out


def add_layer_norm(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor,
                   bias: torch.Tensor, eps: float, bf16_copy: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """layer_norm(x + y) * weight + bias over float32 rows x [rows, dim] (y float32 or bf16,
    None: x alone) -> (float32 [rows, dim], its bf16 copy where `bf16_copy`, else None)."""
    x = x.contiguous()
    rows, dim = x.shape
    if y is not None:
        y = y.contiguous()
        if y.shape != x.shape:
            raise ValueError(f"add_layer_norm: y {tuple(y.shape)} is not x's {tuple(x.shape)}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or bias.dtype != torch.float32:
        raise ValueError("add_layer_norm: x, weight and bias must be float32")
    out = torch.empty_like(x)
    out16 = torch.empty(rows, dim, dtype=torch.bfloat16) if bf16_copy else None
    check(native.loaded().ferry_add_layer_norm(
        x.data_ptr(), None if y is None else y.data_ptr(), 0 if y is None else _DT[y.dtype],
        weight.data_ptr(), bias.data_ptr(), eps, rows, dim, out.data_ptr(),
        None if out16 is None else out16.data_ptr()), "add_layer_norm")
    return out, out16


def pin_team(cpus: list[int]) -> int:
    """Keep thread i of the calling thread's OpenMP team of len(cpus) on CPU cpus[i] -> the
    threads kept so (0 without the kernels, or off Linux)."""
    if native.library() is None:
        return 0
    ids = torch.tensor(cpus, dtype=torch.int32, device="cpu")
    return int(native.loaded().ferry_pin_team(ids.data_ptr(), len(cpus)))

"""The encoder layer's kernels (csrc/encoder.c) against the torch ops they replace: attention
over each packed input's own tokens against torch's scaled_dot_product_attention one input at
a time, the residual add with LayerNorm against F.layer_norm; and the BERT forward that uses
them against the plain torch one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import ops

pytestmark = pytest.mark.usefixtures("native_kernels")


def reference_attention(qkv: torch.Tensor, lengths: list[int], heads: int) -> torch.Tensor:
    out, start, dim = [], 0, qkv.shape[1] // (3 * heads)
    for n in lengths:
        q, k, v = qkv[start:start + n].float().view(1, n, 3, heads, dim).permute(2, 0, 3, 1, 4)
        out.append(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, -1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "dim"), [(12, 32), (4, 64), (3, 20)])
@pytest.mark.parametrize("lengths", [[1], [5], [24], [3, 7, 1, 30], [13, 9, 200]])
def test_attention_over_each_input_alone(dtype: torch.dtype, heads: int, dim: int,
                                         lengths: list[int]) -> None:
    # dim 20: no whole SIMD block of values (the plain C loop); 200: padding keys to 8s
    torch.manual_seed(len(lengths) * 100 + heads)
    qkv = (torch.randn(sum(lengths), 3 * heads * dim) * 2).to(dtype)
    got = ops.encoder_attention(qkv, torch.tensor(lengths), heads, torch.float32)
    want = reference_attention(qkv, lengths, heads)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4)
    # in bf16 out: the float32 result rounded once, as the next product's cast rounds it
    got16 = ops.encoder_attention(qkv, torch.tensor(lengths), heads, torch.bfloat16)
    assert (got16.float() - got.bfloat16().float()).abs().max() <= 2 ** -7 * got.abs().max()


def test_attention_leaves_long_inputs_to_the_caller() -> None:
    qkv = torch.randn(4 + 9 + 3, 3 * 2 * 8)
    got = ops.encoder_attention(qkv, torch.tensor([4, 9, 3]), 2, torch.float32, max_len=5)
    want = reference_attention(qkv, [4, 9, 3], 2)
    assert torch.allclose(got[:4], want[:4], atol=2e-6)
    assert torch.allclose(got[13:], want[13:], atol=2e-6)
    assert not torch.allclose(got[4:13], want[4:13])  # unwritten: the caller's to fill


def test_attention_refuses_a_qkv_of_another_width() -> None:
    with pytest.raises(ValueError, match="encoder_attention"):
        ops.encoder_attention(torch.randn(4, 50), torch.tensor([4]), 4, torch.float32)


@pytest.mark.parametrize("y_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "dim"), [(1, 384), (30, 384), (200, 768), (3, 100)])
def test_add_layer_norm(y_dtype: torch.dtype | None, rows: int, dim: int) -> None:
    torch.manual_seed(rows + dim)
    x = torch.randn(rows, dim) * 3
    y = None if y_dtype is None else torch.randn(rows, dim).to(y_dtype)
    w, b = torch.randn(dim), torch.randn(dim)
    out, out16 = ops.add_layer_norm(x, y, w, b, 1e-12, bf16_copy=True)
    want = F.layer_norm(x if y is None else x + y.float(), (dim,), w, b, 1e-12)
    assert torch.allclose(out, want, atol=1e-5, rtol=1e-5)
    assert out16 is not None and torch.equal(out16, out.bfloat16())  # rounded as .to() rounds
    assert ops.add_layer_norm(x, y, w, b, 1e-12)[1] is None


def test_add_layer_norm_refuses_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="add_layer_norm"):
        ops.add_layer_norm(torch.randn(3, 8), torch.randn(2, 8), torch.ones(8), torch.zeros(8),
                           1e-5)

"""The kernel choice for bf16 weights on CPUs without bf16 arithmetic, and the thread rule."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from engine.execution import cpu
from engine.execution.model import linear_kernels


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("rows", [1, 4, 5, 16, 17, 32])
def test_bf16_linear_matches_a_wide_reference(rows: int, kernels: str) -> None:
    # direct bf16 up to 4 rows with torch's kernel, 16 with Ferry's; widened beyond
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16()
    x = torch.randn(rows, 64, generator=g).bfloat16()
    assert linear_kernels.direct_rows(w) == (linear_kernels.NATIVE_DIRECT_ROWS
                                             if kernels == "native"
                                             else linear_kernels.TORCH_DIRECT_ROWS)
    out = linear_kernels.linear(x, w, b)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 96)
    torch.testing.assert_close(out.double(), reference(x, w, b), atol=0.1, rtol=0.02)


@pytest.mark.usefixtures("emulated")
def test_widened_weights_reuse_one_buffer_per_thread() -> None:
    small, big = torch.ones(8, 8).bfloat16(), torch.full((16, 32), 2.0).bfloat16()
    a = linear_kernels.widened(big)
    assert a.dtype == torch.float32 and bool((a == 2).all())
    b = linear_kernels.widened(small)
    assert b.data_ptr() == a.data_ptr() and bool((b == 1).all())
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(linear_kernels.widened(small).data_ptr()))
    t.start()
    t.join()
    assert seen[0] != a.data_ptr()


needs_onednn = pytest.mark.skipif(not linear_kernels.onednn_works(),
                                  reason="this torch build has no working oneDNN linear")


@pytest.mark.usefixtures("emulated")
def test_widening_goes_a_block_of_weight_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_kernels, "WIDEN_BLOCK", 16)  # 40 rows: blocks of 16, 16, 8
    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, 16, generator=g).bfloat16()  # more rows than the direct kernels take
    w, b = torch.randn(40, 16, generator=g).bfloat16(), torch.randn(40, generator=g).bfloat16()
    out = linear_kernels.linear(x, w, b)
    assert out.shape == (20, 40)
    torch.testing.assert_close(out.double(), reference(x, w, b), atol=0.1, rtol=0.02)


@needs_onednn
@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("rows", [2, 17, 40])
def test_wide_copy_gives_the_widened_products(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=g).bfloat16()
    w, b = torch.randn(96, 64, generator=g).bfloat16(), torch.randn(96, generator=g).bfloat16()
    with_copy = linear_kernels.product_for(w, linear_kernels.wide_copy(w))
    # the same float32 arithmetic on the same (exactly widened) values, just not per call
    torch.testing.assert_close(with_copy(x, w, b), linear_kernels.linear(x, w, b),
                               atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(with_copy(x, w, b).double(), reference(x, w, b),
                               atol=0.1, rtol=0.02)


def test_float32_is_plain_linear() -> None:
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    assert linear_kernels.product_for(w) is F.linear
    torch.testing.assert_close(linear_kernels.linear(x, w), F.linear(x, w), atol=0, rtol=0)


def test_on_fresh_thread_returns_and_raises() -> None:
    caller = threading.get_ident()
    assert cpu.on_fresh_thread(threading.get_ident) != caller
    with pytest.raises(KeyError, match="boom"):
        cpu.on_fresh_thread(lambda: {}["boom"])


@needs_onednn
@pytest.mark.parametrize("rows", [0, 1, 3, 64])
def test_packed_float32_linear_matches(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    packed = linear_kernels.pack(w)
    assert linear_kernels.is_packed(packed) and packed.shape == w.shape
    x = torch.randn(rows, 24, generator=g)
    out = linear_kernels.linear(x, packed, b)
    assert out.shape == (rows, 40)
    torch.testing.assert_close(out, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    strided = torch.randn(rows, 48, generator=g)[:, ::2]  # not contiguous
    torch.testing.assert_close(linear_kernels.linear(strided, packed), F.linear(strided, w),
                               atol=1e-5, rtol=1e-5)


def test_only_float32_cpu_weights_are_packed() -> None:
    w = torch.randn(8, 8).bfloat16()
    assert linear_kernels.pack(w) is w


@needs_onednn
def test_loaded_model_is_packed_and_keeps_its_embedding(tiny_models, make_harness) -> None:
    from engine.execution.model.layers import Linear

    tiny = tiny_models["llama3"]  # tied embeddings: the LM head gets its own packed copy
    model = make_harness(tiny.path).executor.model
    assert model.config.tie_word_embeddings
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(linear_kernels.is_packed(m.weight) for m in linears)
    assert not linear_kernels.is_packed(model.model.embed_tokens.weight)


@needs_onednn
@pytest.mark.usefixtures("emulated")
def test_bf16_model_keeps_float32_copies_within_the_limit(tiny_models, make_harness) -> None:
    from engine.execution.model.layers import Linear

    model = make_harness(tiny_models["llama3"].path, dtype=torch.bfloat16).executor.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.wide is not None and linear_kernels.is_packed(m.wide) for m in linears)
    assert all(m.weight.dtype == torch.bfloat16 for m in linears)  # small batches read bf16
    x = torch.randn(24, model.config.hidden_size).bfloat16()
    head = model.lm_head
    torch.testing.assert_close(head(x).double(), reference(x, head.weight),
                               atol=0.1, rtol=0.02)
    for m in linears:
        m.wide = None
    model.pack_weights(wide_copy_limit=0)  # too big: widen per product instead
    assert all(m.wide is None for m in linears)
    torch.testing.assert_close(head(x).double(), reference(x, head.weight),
                               atol=0.1, rtol=0.02)


def test_stacked_rows_joins_a_fused_projection() -> None:
    """Floats join as one tensor, blocks of one type as one QuantWeight, blocks of several
    types as a SplitWeight; each multiplies as the parts would one by one."""
    from engine.execution.model.linear_kernels import SplitWeight, linear, stacked_rows
    from engine.kernels import quant

    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(32, 64, generator=g) for _ in range(3)]
    x = torch.randn(5, 64, generator=g)
    joined = stacked_rows(parts)
    assert isinstance(joined, torch.Tensor) and joined.shape == (96, 64)
    q8 = [quant.quantize(p, quant.Q8_0) for p in parts]
    one_type = stacked_rows(q8)
    assert isinstance(one_type, quant.QuantWeight) and one_type.out_features == 96
    two_types = stacked_rows([q8[0], q8[1], quant.quantize(parts[2], quant.Q4_0)])
    assert isinstance(two_types, SplitWeight) and two_types.out_features == 96
    for w, pieces in ((one_type, q8), (two_types, two_types.parts)):
        want = torch.cat([linear(x, p) for p in pieces], dim=1)
        assert torch.allclose(linear(x, w), want, atol=1e-5)
    with pytest.raises(ValueError, match="floats and blocks"):
        stacked_rows([parts[0], q8[1]])


def test_quantized_matrices_pad_their_rows_to_whole_blocks(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """`quantized` gives quant.quantize's blocks bit for bit, a few rows at a time and from
    float16 too; a matrix whose rows are not whole blocks gets zero columns, and its products
    pad the input alike: the padded product's numbers, near the float product's."""
    from engine.execution.model.linear_kernels import PaddedWeight, linear, quantized
    from engine.kernels import quant

    monkeypatch.setattr(linear_kernels, "QUANTIZE_CHUNK", 200)  # several rows at a time
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(24, 64, generator=g).half()
    blocks = quantized(whole, quant.Q8_0)
    assert isinstance(blocks, quant.QuantWeight)
    assert torch.equal(blocks.data, quant.quantize(whole.float(), quant.Q8_0).data)

    w, b = torch.randn(24, 72, generator=g), torch.randn(24, generator=g)
    x = torch.randn(7, 72, generator=g)
    padded = quantized(w, quant.Q8_0)
    assert isinstance(padded, PaddedWeight)
    assert (padded.in_features, padded.blocks.in_features, padded.out_features) == (72, 96, 24)
    assert padded.parts == (padded.blocks,) and padded.nbytes == 24 * 3 * 34
    reference = quant.quantize(F.pad(w, (0, 24)), quant.Q8_0)
    assert torch.equal(padded.blocks.data, reference.data)
    got = linear(x, padded, b)
    assert torch.equal(got, quant.quant_matmul(F.pad(x, (0, 24)), reference, b))
    torch.testing.assert_close(got, F.linear(x, w, b), atol=0.1, rtol=0.02)

"""The kernel choice for bf16 weights on CPUs without bf16 arithmetic, and the thread rule."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from engine import cpu
from engine.model import linear_kernels


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the widening path on any CPU (it is the default only where bf16 is emulated)."""
    monkeypatch.setattr(linear_kernels, "emulated_bf16", lambda dtype, device:
                        dtype == torch.bfloat16 and device.type == "cpu")


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("rows", [1, 4, 5, 32])
def test_bf16_linear_matches_a_wide_reference(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16()
    x = torch.randn(rows, 64, generator=g).bfloat16()
    assert linear_kernels.widens(x, w) is (rows > linear_kernels.BF16_DIRECT_ROWS)
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


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mm_into_a_column_block(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 16, generator=g).to(dtype)
    w = torch.randn(40, 16, generator=g).bfloat16()
    out = torch.zeros(8, 64, dtype=dtype)
    linear_kernels.mm_into(x.bfloat16() if dtype == torch.bfloat16 else x, w, out[:, 10:50])
    assert bool((out[:, :10] == 0).all()) and bool((out[:, 50:] == 0).all())
    torch.testing.assert_close(out[:, 10:50].double(), reference(x, w), atol=0.1, rtol=0.02)


def test_float32_is_plain_linear() -> None:
    x, w = torch.randn(8, 16), torch.randn(4, 16)
    assert not linear_kernels.widens(x, w)
    torch.testing.assert_close(linear_kernels.linear(x, w), F.linear(x, w), atol=0, rtol=0)


def test_on_fresh_thread_returns_and_raises() -> None:
    caller = threading.get_ident()
    assert cpu.on_fresh_thread(threading.get_ident) != caller
    with pytest.raises(KeyError, match="boom"):
        cpu.on_fresh_thread(lambda: {}["boom"])

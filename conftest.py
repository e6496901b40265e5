"""Fixtures every test package may use: torch thread hygiene and the native-kernel switches."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> object:
    """from_pretrained sets the process-wide torch thread count; undo it after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def skip_without_native_kernels() -> None:
    from engine.kernels import native
    if native.library() is None:
        pytest.skip(f"native kernels: {native.status()}")


@pytest.fixture
def native_kernels() -> None:
    """Ferry's fused CPU kernels are loaded (the test is skipped, with the reason, if not)."""
    skip_without_native_kernels()


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat bf16 as emulated on any CPU, so the paths meant for such CPUs (widening, Ferry's
    bf16 product, fused decode layers) run here even where bf16 is native."""
    from engine.execution.model import linear_kernels
    monkeypatch.setattr(linear_kernels, "emulated_bf16", lambda dtype, device:
                        dtype == torch.bfloat16 and device.type == "cpu")


@pytest.fixture(params=["native", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with Ferry's fused CPU kernels and again on the plain torch path."""
    from engine.kernels import ops
    if request.param == "torch":
        monkeypatch.setattr(ops, "usable", lambda t: False)
    else:
        skip_without_native_kernels()
    return request.param

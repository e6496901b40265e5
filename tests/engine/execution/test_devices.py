"""The device a model runs on is said with its reason (never a silent CPU fall-back), and the
memory a model holds is counted as it sits on its device."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.execution import devices, footprint
from engine.execution.model.config import MoESpec
from engine.execution.model.layers import Linear
from engine.execution.model.layers.moe import MoEMLP
from engine.kernels import quant


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_without_a_gpu_says_so(no_cuda: None, monkeypatch: pytest.MonkeyPatch,
                                    tmp_path: Path) -> None:
    monkeypatch.setattr(devices, "NVIDIA_PROC", tmp_path / "absent")
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert devices.pick_device("auto") == devices.DevicePick("cpu", "no NVIDIA GPU found")
    assert devices.pick_device("cpu") == devices.DevicePick("cpu", "requested")


def test_a_gpu_torch_cannot_use_is_reported(no_cuda: None, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02  Tue Jul 13\n")
    monkeypatch.setattr(devices, "NVIDIA_PROC", proc)
    monkeypatch.setattr(torch.version, "cuda", None)
    picked = devices.pick_device("auto")
    assert picked.device == "cpu" and "CPU build" in picked.why
    assert "CPU build" in caplog.text  # logged, not silent
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    picked = devices.pick_device("auto")
    assert "470.57.02" in picked.why and "too old" in picked.why
    with pytest.raises(ValueError, match="too old"):
        devices.pick_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        devices.pick_device("tpu")


def test_flashinfer_kernels_prebuilt_compiled_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def version(name: str) -> str:
        if name == "flashinfer-jit-cache":
            return "0.6.13+cu130"
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert devices.flashinfer_kernels() == (True, "prebuilt (flashinfer-jit-cache 0.6.13+cu130)")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version("none"))
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/opt/cuda/bin/nvcc")
    ok, how = devices.flashinfer_kernels()
    assert ok and "/opt/cuda/bin/nvcc" in how
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    ok, how = devices.flashinfer_kernels()
    assert not ok and "no nvcc" in how


def test_weight_bytes_counts_each_storage_once() -> None:
    lin = Linear(64, 32, True, torch.bfloat16, "cpu")
    assert footprint.weight_bytes(lin) == (64 * 32 + 32) * 2
    tied = torch.nn.ModuleList([lin, Linear(64, 32, False, torch.bfloat16, "cpu")])
    tied[1].weight = lin.weight  # a tied head: one storage
    assert footprint.weight_bytes(tied) == footprint.weight_bytes(lin)
    q = Linear(64, 32, False, torch.float32, "cpu")
    q.set_quantized(quant.quantize(torch.randn(32, 64, device="cpu"), quant.Q8_0))
    assert footprint.weight_bytes(q) == 32 * 2 * 34  # two 34-byte Q8_0 blocks a row
    assert footprint.weight_bytes(q, "cuda") == 0  # nothing of it on a GPU


def test_stacked_experts_are_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.kernels import native

    monkeypatch.setattr(native, "library", lambda: None)
    moe = MoEMLP(64, MoESpec(4, 2, 32), "silu", torch.float32, "cpu")
    before = footprint.weight_bytes(moe)
    with torch.inference_mode():
        moe(torch.randn(3, 64, device="cpu"))
    assert moe.stacked() is not None and footprint.weight_bytes(moe) == before


def test_kv_fitted_to_the_free_memory(caplog: pytest.LogCaptureFixture) -> None:
    gib = 1 << 30
    assert footprint.fit_kv_tokens(16384, 16, 1000, 40 * gib, 80 * gib) == 16384
    got = footprint.fit_kv_tokens(10**7, 16, 1 << 20, 4 * gib, 16 * gib, other=gib)
    assert got == (4 * gib - footprint.reserve(16 * gib) - gib) // (1 << 20) // 16 * 16
    assert "does not fit" in caplog.text
    with pytest.raises(ValueError, match="no room"):
        footprint.fit_kv_tokens(16384, 16, 1 << 20, gib, 16 * gib)

"""Which device a model runs on, and why: said at start, never a silent fall-back.

`auto` takes CUDA when torch can use it; otherwise the CPU, with the reason: no NVIDIA GPU
found, a CPU build of torch on a machine that has one, or a driver too old for torch's CUDA.
Also what `ferry doctor` and the banner report about the GPU side: the torch build and
FlashInfer's kernels (prebuilt, compiled at first use by nvcc, or neither).
"""
from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

NVIDIA_PROC = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True, slots=True)
class DevicePick:
    device: str  # "cpu", "cuda", "cuda:1"
    why: str  # in words, for the banner and doctor


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version line, or "present" where only nvidia-smi shows
    one; None when this machine shows no NVIDIA GPU."""
    try:
        line = NVIDIA_PROC.read_text().splitlines()[0]
    except (OSError, IndexError):
        return "present" if shutil.which("nvidia-smi") else None
    for word in line.split():
        if word[:1].isdigit() and "." in word:
            return word
    return "present"


def torch_build() -> str:
    """e.g. "2.11.0 (CUDA 13.0 build)" or "2.13.0 (CPU build)"."""
    cuda = torch.version.cuda
    return f"{torch.__version__} ({f'CUDA {cuda}' if cuda else 'CPU'} build)"


def cuda_problem() -> str | None:
    """Why torch cannot use CUDA here, or None when it can."""
    if torch.cuda.is_available():
        return None
    driver = nvidia_driver()
    if driver is None:
        return "no NVIDIA GPU found"
    if not torch.version.cuda:
        return ("an NVIDIA GPU is present but this torch is a CPU build; reinstall with "
                "install.sh (or `make run`), which takes the CUDA build there")
    return (f"an NVIDIA GPU is present (driver {driver}) but torch's CUDA "
            f"{torch.version.cuda} cannot use it: the driver is probably too old for it, "
            "or the GPU is not visible to this process (CUDA_VISIBLE_DEVICES)")


def pick_device(requested: str) -> DevicePick:
    """The device `requested` ("auto", "cpu", "cuda", "cuda:N") runs on. An explicit CUDA
    device that torch cannot use is an error (ValueError); auto falls back to the CPU with
    the reason, logged as a warning where a GPU is present."""
    if requested == "cpu":
        return DevicePick("cpu", "requested")
    problem = cuda_problem()
    if requested.startswith("cuda"):
        if problem:
            raise ValueError(f"device {requested} requested, but {problem}")
        index = torch.device(requested).index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {requested} requested, but torch sees "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        return DevicePick(requested, torch.cuda.get_device_name(index))
    if requested != "auto":
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {requested!r}")
    if problem is None:
        return DevicePick("cuda", torch.cuda.get_device_name(0))
    if nvidia_driver() is not None:
        log.warning("running on the CPU: %s", problem)
    return DevicePick("cpu", problem)


def flashinfer_kernels() -> tuple[bool, str]:
    """(whether FlashInfer has its attention kernels, how): prebuilt by flashinfer-jit-cache
    (FlashInfer's own package index), else compiled by nvcc at first use. flashinfer-cubin
    (the gpu extra) holds other kernels' binaries, not the decode and prefill ones."""
    try:
        version = importlib.metadata.version("flashinfer-jit-cache")
        return True, f"prebuilt (flashinfer-jit-cache {version})"
    except importlib.metadata.PackageNotFoundError:
        pass
    cuda_home = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    nvcc = shutil.which("nvcc") or (str(cuda_home / "bin/nvcc")
                                    if (cuda_home / "bin/nvcc").is_file() else None)
    if nvcc:
        return True, f"compiled by {nvcc} at first use (minutes, once; cached after)"
    return False, ("none: no flashinfer-jit-cache and no nvcc to compile them (install the "
                   "CUDA toolkit, or flashinfer-jit-cache: docs/gpu.md)")

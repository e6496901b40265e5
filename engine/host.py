"""The machine the engine runs on, for the host's tools (the command line, `ferry doctor`,
`ferry bench`, the serve command): the CPU level and its cap, the devices and the torch
build, FlashInfer and oneDNN, the native kernels' build folder and status, memory in use,
the heap settled once serving starts, batch invariance (`deterministic`).

These are not the engine's API (`engine` is): they describe and prepare the machine. The
CPU-level names import at once and without torch, so the command line applies the cap before
torch loads; the others load on first use (PEP 562), as `engine`'s execution names do.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.kernels.cpu_level import CpuLevelError
from engine.kernels.cpu_level import apply_torch_env as apply_cpu_cap
from engine.kernels.cpu_level import describe as describe_cpu_level
from engine.lazy import lazy_getattr
from engine.models.memory import rss_bytes, settled_heap
from engine.priority import job_below, lower_priority, start_job_below

if TYPE_CHECKING:
    from engine.execution.attention.choice import flashinfer_missing, flashinfer_version
    from engine.execution.cpu import cpu_has_native_bf16
    from engine.execution.devices import flashinfer_kernels, pick_device, torch_build
    from engine.execution.footprint import gpu_room
    from engine.execution.model.linear_kernels import onednn_works
    from engine.kernels.invariance import set_batch_invariant
    from engine.kernels.native import set_build_dir as set_kernel_build_dir
    from engine.kernels.native import status as kernel_status

# name -> "module:attribute", imported on first access
_LAZY: dict[str, str] = {
    "cpu_has_native_bf16": "engine.execution.cpu:cpu_has_native_bf16",
    "pick_device": "engine.execution.devices:pick_device",
    "flashinfer_kernels": "engine.execution.devices:flashinfer_kernels",
    "flashinfer_missing": "engine.execution.attention.choice:flashinfer_missing",
    "flashinfer_version": "engine.execution.attention.choice:flashinfer_version",
    "gpu_room": "engine.execution.footprint:gpu_room",
    "torch_build": "engine.execution.devices:torch_build",
    "onednn_works": "engine.execution.model.linear_kernels:onednn_works",
    "set_batch_invariant": "engine.kernels.invariance:set_batch_invariant",
    "set_kernel_build_dir": "engine.kernels.native:set_build_dir",
    "kernel_status": "engine.kernels.native:status",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "CpuLevelError",
    "apply_cpu_cap",
    "cpu_has_native_bf16",
    "describe_cpu_level",
    "flashinfer_kernels",
    "flashinfer_missing",
    "flashinfer_version",
    "gpu_room",
    "job_below",
    "kernel_status",
    "lower_priority",
    "onednn_works",
    "pick_device",
    "rss_bytes",
    "set_batch_invariant",
    "set_kernel_build_dir",
    "settled_heap",
    "start_job_below",
    "torch_build",
]

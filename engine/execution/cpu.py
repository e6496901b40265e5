"""Facts and rules of running torch on the CPU: thread count, native bf16, one OpenMP team.

Why one team: torch's CPU kernels run on OpenMP (libgomp), which keeps a team of worker
threads per thread that starts parallel work. When a second thread (the engine's) starts one
while the main thread's team still exists, libgomp counts more workers than cores and stops
spinning between parallel regions; every one of the ~400 small regions of a decode step then
pays a futex wake-up. Measured here (2 cores): a bf16 batch-1 step took 67 ms on the engine
thread after the model was loaded on the main thread, 35 ms when no other team existed. So all
torch work runs on the engine thread, and one-off work before it (loading, converting) runs on
a short-lived thread whose team ends with it (`on_fresh_thread`). The engine thread's team is
one thread smaller per job below the engine's priority that has run a while, and keeps one
thread per core (`RoundThreads`; engine.priority, engine.affinity).

Why freed memory is kept: every round allocates and frees the same activations, megabytes each
in a prefill chunk. glibc serves such a block with a fresh mmap and hands a freed heap top back
to the kernel, so each round faulted its tensors in again page by page (zeroed by the kernel).
`reuse_freed_memory` has glibc keep blocks up to 32 MB in its heaps and trim only above
256 MB; unloading a model still returns everything (engine.models.release_memory).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from engine.affinity import free_thread, team_cpus
from engine.kernels import cpu_level
from engine.kernels.ops import pin_team
from engine.priority import engine_threads

T = TypeVar("T")


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 in hardware (AVX512-BF16 or AMX); else bf16 is emulated
    and its matrix products are slower than float32 ones. FERRY_CPU below amx: emulated."""
    if not cpu_level.allows_bf16():
        return False
    try:
        if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
            return True
    except AttributeError:  # older torch: fall back to the kernel's flags
        pass
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False  # no flags to read (macOS, Windows): assume emulated, the safe choice
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})  # bf16: Arm's flag


class RoundThreads:
    """The OpenMP team of the thread that runs an executor's rounds: `full` threads, one fewer
    per job below the engine's priority that has run LEND_AFTER by the round's start
    (engine.priority), each kept on a core of its own once the team first has them all
    (engine.affinity). torch's count is per thread under OpenMP, so it is set on the calling
    thread, when that thread or the count changes."""

    def __init__(self, full: int) -> None:
        self.full = full
        self._set: tuple[int, int] | None = None  # (thread, count) set last
        self._placed: int | None = None  # the thread whose team was placed

    def fit(self) -> None:
        thread, wanted = threading.get_ident(), engine_threads(self.full)
        if self._set != (thread, wanted):
            torch.set_num_threads(wanted)
            self._set = (thread, wanted)
        if wanted == self.full and self._placed != thread:
            self._placed = thread
            cpus = team_cpus(wanted)
            if cpus is not None:
                pin_team(cpus)


# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


@functools.cache
def reuse_freed_memory(mmap_above: int = 32 << 20, trim_above: int = 256 << 20) -> bool:
    """Have glibc serve blocks below `mmap_above` bytes from its heaps and keep up to
    `trim_above` bytes of a heap's free top, instead of returning them to the kernel (once per
    process). False where the C library is not glibc (musl, macOS, Windows): nothing to tune."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):  # musl has no mallopt
        mallopt = None
    if mallopt is None:
        return False
    # glibc refuses an mmap threshold above half its heap size (32 MB on 64-bit)
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_above)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_above))


def on_fresh_thread(fn: Callable[[], T], name: str = "ferry-load") -> T:
    """Run `fn` on a new thread and return its result (or raise its exception): its OpenMP
    team ends with the thread, so the engine thread later owns the only one."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        free_thread()  # from the engine's thread: not on its one core
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller
            error.append(exc)

    # daemon: Ctrl+C in the caller must not wait for a long conversion (which writes to a
    # temporary folder and renames it, so stopping halfway leaves nothing broken)
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def emulated_bf16(dtype: torch.dtype, device: torch.device) -> bool:
    """True for bf16 tensors on a CPU without bf16 arithmetic, where products are better
    computed in float32 (engine.execution.model.linear_kernels has the figures)."""
    return dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16()

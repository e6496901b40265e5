"""Threads below the engine's priority: work one request asks for (compiling its grammar,
tokenizing a long prompt, decoding its images) must not take the cores from the engine's
threads, which write every user's tokens. On a machine with few cores the request that asked
waits, not the others.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from pathlib import Path

NICE = 10  # added to the process's nice value (the page-rendering worker's too)
_lowered = threading.local()


def lower_priority(step: int = NICE) -> None:
    """The calling thread's nice value set to the process's (its main thread's) plus `step`
    (at most 19), once per thread, on Linux, where each thread has its own; elsewhere (a
    thread id is no process id there) nothing changes. A thread started by a lowered one
    inherits its value and is not lowered twice; no thread's priority is ever raised.

    Its torch operations (an image's patches copied into place) run on it alone
    (_one_openmp_thread)."""
    if getattr(_lowered, "done", False):
        return
    _lowered.done = True
    _one_openmp_thread()
    if sys.platform != "linux":
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(now, min(19, base + step)))


def _one_openmp_thread() -> None:
    """torch's operations on the calling thread run on it alone, where torch runs them on
    libgomp (Linux): a parallel region started here would bring OpenMP threads of its own,
    and once libgomp manages more threads than there are cores it stops spinning between
    parallel regions, the engine's too. Each of a decode round's hundreds of regions then
    waits to wake its threads (9% slower decoding on 2 cores, from the first picture on).
    Only this thread's OpenMP count is set: torch.set_num_threads would also change the
    count torch gives every thread it has not seen yet. Nothing is imported for this."""
    torch = sys.modules.get("torch")
    if torch is None or torch.__file__ is None:
        return
    gomp = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if not gomp.exists():  # torch's OpenMP is another runtime here (macOS, Windows)
        return
    # torch sets a thread's count from its own once, on the thread's first operation: that
    # happens now, so that it cannot undo the count set after it
    torch.get_num_threads()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(str(gomp)).omp_set_num_threads(1)

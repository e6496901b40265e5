"""Threads below the engine's priority: work one request asks for (compiling its grammar,
tokenizing a long prompt, decoding its images) must not take the cores from the engine's
threads, which write every user's tokens. On a machine with few cores the request that asked
waits, not the others.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

NICE = 10  # added to the process's nice value (the page-rendering worker's too)
_lowered = threading.local()


def lower_priority(step: int = NICE) -> None:
    """The calling thread's nice value set to the process's (its main thread's) plus `step`
    (at most 19), once per thread, on Linux, where each thread has its own; elsewhere (a
    thread id is no process id there) nothing changes. A thread started by a lowered one
    inherits its value and is not lowered twice; no thread's priority is ever raised."""
    if sys.platform != "linux" or getattr(_lowered, "done", False):
        return
    _lowered.done = True
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, max(now, min(19, base + step)))

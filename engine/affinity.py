"""Which CPUs the engine's OpenMP team runs on: one thread on each core, each kept there.

With a third busy thread on two cores (a request's tokenizing, a page being parsed) the
scheduler often put the engine's two OpenMP threads on one core and the other thread on the
other. Every parallel region of a round then waited for the thread not running: rounds of
~20 ms took 100-260 ms (2-core Intel Xeon). Kept on cores of their own, the team loses only
what the other thread takes of one core. libgomp keeps a team's threads for the life of the
thread that leads it, so they are placed once (RoundThreads, engine.execution.cpu).

A thread starts on its creator's CPUs: one that the engine's thread starts would share its
one core, so threads it may start let go of that first (free_thread). The process's main
thread is never kept on one CPU: processes it starts would inherit that.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

# a placement the user asked libgomp for wins
USER_PLACEMENT = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")


def process_cpus() -> list[int]:
    """The CPUs the process may run on (its main thread's), [] where that is unknown."""
    if sys.platform != "linux":
        return []
    try:
        return sorted(os.sched_getaffinity(os.getpid()))
    except OSError:
        return []


def team_cpus(threads: int) -> list[int] | None:
    """The CPU for each thread of a team of `threads` the calling thread leads (Linux), else
    None: a team of one, more threads than CPUs, the main thread, or a placement the user
    set."""
    cpus = process_cpus()
    if threads < 2 or threads > len(cpus) or threading.current_thread() is \
            threading.main_thread() or any(os.environ.get(k) for k in USER_PLACEMENT):
        return None
    return cpus[:threads]


def free_thread() -> None:
    """Let the calling thread run on any of the process's CPUs again."""
    cpus = process_cpus()
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)

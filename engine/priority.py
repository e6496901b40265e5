"""Threads below the engine's priority: work one request asks for (compiling its grammar,
tokenizing a long prompt, decoding its images) must not take the cores from the engine's
threads, which write every user's tokens. On a machine with few cores the request that asked
waits, not the others.

Priority alone does not keep the engine's pace on two cores: while such a job held one, the
engine's two OpenMP threads often shared the other, and each of a round's parallel regions
waited for the thread not running (token gaps of 110-230 ms against ~20 at rest). So the
engine also lends the job a core: every job below its priority is counted while it runs
(job_below, start_job_below), and each round runs on one OpenMP thread fewer per job
that has run LEND_AFTER (engine_threads), lending at most half its threads.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from engine.affinity import free_thread

NICE = 10  # added to the process's nice value (the page-rendering worker's too)
_lowered = threading.local()
LEND_AFTER = 0.01  # seconds a job has run before the engine's rounds leave it a core
# the start (time.monotonic) of each job below the engine's priority running now, here or in
# a worker process, by key
_jobs: dict[int, float] = {}
_keys = itertools.count()
_jobs_lock = threading.Lock()


def jobs_below() -> int:
    """Jobs below the engine's priority running now."""
    return len(_jobs)


def engine_threads(full: int, now: float | None = None) -> int:
    """The OpenMP threads for the engine's next round: `full` less one per job below its
    priority that has run LEND_AFTER or longer, never fewer than half of `full` (rounded
    up): many long jobs at once (several users' megabyte prompts on a machine with many
    cores) share what is lent. A shorter job (a short prompt's tokens) most likely ends
    before the round does; the round that it overlaps loses only what the job takes of one
    core (engine.affinity)."""
    since = (time.monotonic() if now is None else now) - LEND_AFTER
    with _jobs_lock:
        lent = sum(start <= since for start in _jobs.values())
    return max((full + 1) // 2, full - lent)


def start_job_below() -> Callable[[], None]:
    """Count one job below the engine's priority until the function returned is called
    (again is harmless): for a job whose end another thread sees (a worker process's)."""
    key = next(_keys)
    with _jobs_lock:
        _jobs[key] = time.monotonic()

    def end() -> None:
        with _jobs_lock:
            _jobs.pop(key, None)
    return end


@contextlib.contextmanager
def job_below() -> Iterator[None]:
    """Count the job the calling thread runs within, below the engine's priority."""
    end = start_job_below()
    try:
        yield
    finally:
        end()


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
    free_thread()  # started by the engine's thread, it would share that thread's one core
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

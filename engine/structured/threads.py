"""The threads every grammar compile runs on: few, named, and with a stack that holds the
deepest grammar engine.structured.limits lets through.

llguidance recurses once per link of a chain of rules or `$ref`s, a few KB of native stack a
link: the default 8 MB stack overflows near 3,000 links and takes the process with it. The
limits allow at most max_rules counted rules, and within max_bytes no more than ~45,000
links of any shape; 256 MB holds those with room to spare. The stack is reserved address
space: only what a compile touches is ever backed by memory.

A compile of a large grammar takes a core for a fraction of a second. The threads run at a
lower priority (Linux: `nice` is per thread), so that on a machine with few cores the engine's
threads, which write every user's tokens, keep theirs: the compile waits, not the others. While
a compile runs, the engine's rounds run on one core fewer (engine.priority).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.priority import NICE, job_below, lower_priority

T = TypeVar("T")
STACK_BYTES = 256 << 20
WORKERS = 2
NAME = "ferry-grammar"
_stack_lock = threading.Lock()  # threading.stack_size is process-wide: set, start, restore


class CompileThreads:
    def __init__(self, workers: int = WORKERS, stack_bytes: int = STACK_BYTES) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = \
            queue.SimpleQueue()
        self._workers, self._stack = workers, stack_bytes
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        """fn() on a compile thread; blocks the caller until it is done (raises what fn
        raises). Called from a compile thread, it runs in place (no waiting on oneself)."""
        if threading.current_thread() in self._threads:
            return fn()
        self._start()
        future: Future[T] = Future()
        self._jobs.put((future, fn))
        return future.result()

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            with _stack_lock:
                old = threading.stack_size(self._stack)
                try:
                    for i in range(self._workers):
                        t = threading.Thread(target=self._loop, name=f"{NAME}-{i}", daemon=True)
                        t.start()
                        self._threads.append(t)
                finally:
                    threading.stack_size(old)

    def _loop(self) -> None:
        lower_priority(NICE)
        while True:
            future, fn = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with job_below():
                    result = fn()
                future.set_result(result)
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)


THREADS = CompileThreads()

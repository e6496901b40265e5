"""`ferry bench --profile`'s sampler: samples are filed under the innermost frame of a known
part of Ferry, C time under its Python caller, a waiting thread as idle."""
from __future__ import annotations

import threading
import time

import pytest

from app.bench.profile import IDLE, OTHER, StackSampler, part_of
from engine.scheduling.page_allocator import PageAllocator


def test_a_running_thread_is_filed_by_its_innermost_known_frame() -> None:
    stop = threading.Event()

    def work() -> None:  # scheduling bookkeeping in a loop (engine/scheduling/)
        while not stop.is_set():
            alloc = PageAllocator(64)
            for _ in range(8):
                alloc.free(alloc.allocate())

    worker = threading.Thread(target=work, name="busy-scheduling", daemon=True)
    worker.start()
    try:
        with StackSampler("busy-scheduling", interval=0.001) as sampler:
            time.sleep(0.3)
    finally:
        stop.set()
        worker.join()
    top = sampler.breakdown()[0]
    assert top[0] == "scheduling" and top[1] > 0.5, sampler.counts


def test_a_waiting_thread_is_idle_and_unknown_code_is_other() -> None:
    gate = threading.Event()
    waiter = threading.Thread(target=gate.wait, name="waiting", daemon=True)
    waiter.start()
    try:
        with StackSampler("waiting", interval=0.001) as sampler:
            time.sleep(0.1)
    finally:
        gate.set()
        waiter.join()
    assert set(sampler.counts) == {IDLE} and sampler.breakdown() == []
    assert "100.0% idle" in sampler.report()
    assert part_of(None) == OTHER


def test_a_missing_thread_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no thread named"), StackSampler("no-such-thread"):
        pass

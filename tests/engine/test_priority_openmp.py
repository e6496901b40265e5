"""A lowered worker thread's torch work (an image's patches copied into place) starts no
OpenMP threads of its own: with more libgomp threads than cores, libgomp stops spinning
between the engine's parallel regions, and decoding on 2 cores was 9% slower from the first
picture on. The engine's count and the one torch gives new threads stay as they were."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
import torch

from engine.priority import lower_priority

pytestmark = pytest.mark.skipif(
    sys.platform != "linux"
    or not (Path(torch.__file__).parent / "lib" / "libgomp.so.1").exists(),
    reason="torch runs its parallel work on its own libgomp on Linux only")


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def on_new_thread(fn: object) -> list[int]:
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.extend(fn()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out


@pytest.fixture
def two_threads() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the engine's count, which new threads start from
    yield
    torch.set_num_threads(before)


def test_a_lowered_threads_torch_work_starts_no_openmp_threads(two_threads: object) -> None:
    big = torch.randn(2048, 2048)

    def lowered() -> list[int]:
        lower_priority()
        before = tasks()
        big.clone()  # a copy torch splits over its threads
        return [torch.get_num_threads(), tasks() - before]

    assert on_new_thread(lowered) == [1, 0]
    assert torch.get_num_threads() == 2  # this thread's count is its own
    # a thread not lowered still starts from torch's count, and its work is split
    assert on_new_thread(lambda: [torch.get_num_threads()]) == [2]

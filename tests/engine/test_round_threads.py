"""The engine's OpenMP team: one thread fewer per job below the engine's priority running at
a round's start (that job gets the core), and each thread kept on a core of its own, so that
a third busy thread cannot put two of the team on one core, where they wait for each other at
every parallel region. Threads the engine's thread starts are not kept on its core."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch

from engine.affinity import process_cpus, team_cpus
from engine.execution.cpu import RoundThreads, on_fresh_thread
from engine.kernels import native
from engine.priority import (
    LEND_AFTER,
    engine_threads,
    job_below,
    jobs_below,
    lower_priority,
    start_job_below,
)

T = TypeVar("T")


def on_new_thread(fn: Callable[[], T]) -> T:
    """fn() on a thread that is not the main one; its OpenMP team ends with it."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def allowed(tid: int | str = "self") -> list[int]:
    """The CPUs a thread of this process may run on (Cpus_allowed_list)."""
    path = Path("/proc/self/task") / str(tid) / "status" if tid != "self" \
        else Path("/proc/thread-self/status")
    line = next(x for x in path.read_text().splitlines() if x.startswith("Cpus_allowed_list"))
    cpus: list[int] = []
    for part in line.split(":")[1].strip().split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def test_jobs_are_counted_until_they_end() -> None:
    before = jobs_below()
    end = start_job_below()
    with job_below():
        assert jobs_below() == before + 2
    assert jobs_below() == before + 1
    end()
    end()  # again: harmless
    assert jobs_below() == before
    with pytest.raises(KeyError), job_below():
        raise KeyError("a failing job ends too")
    assert jobs_below() == before


def no_jobs() -> None:
    """None counted: an earlier test's render may still be ending in its worker process."""
    deadline = time.monotonic() + 10
    while jobs_below() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert jobs_below() == 0, "a job below the engine's priority was never ended"


def test_a_job_takes_one_thread_once_it_has_run_a_while_and_at_most_half() -> None:
    no_jobs()
    full = 6
    later = time.monotonic() + LEND_AFTER + 1.0
    assert engine_threads(full, later) == 6
    with job_below():
        assert engine_threads(full, time.monotonic()) == 6  # just started: likely to end soon
        assert engine_threads(full, later) == 5
        with job_below(), job_below():
            assert engine_threads(full, later) == 3
            with job_below(), job_below():
                assert engine_threads(full, later) == 3  # half stays the engine's
    assert engine_threads(full, later) == 6
    with job_below(), job_below():
        assert engine_threads(2, later) == 1  # two cores: one lent
        assert engine_threads(1, later) == 1  # one core: the engine keeps it
        assert engine_threads(3, later) == 2


def test_a_round_runs_on_one_thread_fewer_while_a_job_runs() -> None:
    no_jobs()

    def rounds() -> list[int]:
        team = RoundThreads(2)
        counts = []
        for job in (False, True, False):
            with job_below() if job else contextlib.nullcontext():
                if job:
                    time.sleep(LEND_AFTER * 1.5)
                team.fit()
                counts.append(torch.get_num_threads())
        return counts

    assert on_new_thread(rounds) == [2, 1, 2]


def test_the_main_thread_is_never_placed() -> None:
    # processes it starts would inherit its one CPU
    assert team_cpus(2) is None
    assert on_new_thread(lambda: team_cpus(1)) is None
    assert on_new_thread(lambda: team_cpus(len(process_cpus()) + 1)) is None


needs_two_cpus = pytest.mark.skipif(
    sys.platform != "linux" or len(process_cpus()) < 2 or native.library() is None,
    reason="placing threads needs Linux, two CPUs and the native kernels")


def lowered_allowed() -> list[int]:
    lower_priority()
    return allowed()


@needs_two_cpus
def test_each_thread_of_the_team_keeps_a_core_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"):
        monkeypatch.delenv(name, raising=False)
    cpus = process_cpus()
    every = set(allowed())
    earlier = set(os.listdir("/proc/self/task"))  # an earlier test's engine may still run

    def engine_thread() -> tuple[list[int], list[list[int]], list[int], list[int],
                                 list[int]]:
        RoundThreads(2).fit()
        torch.randn(2048, 2048).clone()  # work split over the team
        mine = allowed()
        kept = [allowed(tid) for tid in set(os.listdir("/proc/self/task")) - earlier
                if len(allowed(tid)) == 1]
        # threads this one starts run on every CPU again
        loader = on_fresh_thread(allowed)
        lowered = on_new_thread(lowered_allowed)
        return mine, kept, loader, lowered, allowed()

    mine, kept, loader, lowered, after = on_new_thread(engine_thread)
    assert mine == [cpus[0]]
    assert sorted(kept) == [[cpus[0]], [cpus[1]]]  # the thread and its one OpenMP thread
    assert set(loader) == every
    assert set(lowered) == every
    assert after == [cpus[0]]
    assert set(allowed()) == every  # the test's own (main) thread never moved


@needs_two_cpus
def test_a_placement_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_PROC_BIND", "false")
    assert on_new_thread(lambda: team_cpus(2)) is None

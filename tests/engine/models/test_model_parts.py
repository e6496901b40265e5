"""The model set's parts without models: keep_alive, the budget, the fair turns."""
from __future__ import annotations

import itertools
import threading
import time

import pytest

from engine.config import EngineConfig
from engine.models import Budget, FairTurns, Resident, parse_keep_alive
from engine.runtime.engine import Engine
from engine.scheduling.batch import Batch
from engine.scheduling.request import RequestError, SamplingParams
from engine.sim.simulator import SimExecutor


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), (30, 30.0), ("0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0),
    ("250ms", 0.25), (-1, None), (-1.0, None), ("-1", None), ("-1m", None), (2.5, 2.5),
    ("1e3", 1000.0), ("-0", 0.0)])
def test_keep_alive_reads_ollama_durations(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", [
    "soon", "5 minutes", "", "m5", True, False, [1], None, "nan", "NaN", "inf", "-inf",
    "1e999", float("nan"), float("inf"), 10**400, -2, -0.5, "-5m", "-2",
    "1" * 20_000 + "x", "5m" * 40])
def test_keep_alive_refuses_the_unreadable(value: object) -> None:
    """NaN, infinities, booleans, negatives other than -1, unreadable or overlong text
    (20,000 digits took the duration scan seconds): refused with a message naming the
    field (the API answers 400 with it)."""
    with pytest.raises(RequestError, match="keep_alive"):
        parse_keep_alive(value)


def test_budget_unloads_the_least_recently_used_idle_model() -> None:
    budget = Budget(max_loaded=2, max_memory=1000)
    a = Resident("a", 100, busy=False, last_used=5.0)
    b = Resident("b", 100, busy=False, last_used=1.0)
    assert budget.make_room([a], 100) == []
    assert budget.make_room([a, b], 100) == ["b"]  # b was used longest ago
    assert budget.make_room([a, Resident("b", 100, True, 1.0)], 100) == ["a"]
    busy = [Resident("a", 100, True, 5.0), Resident("b", 100, True, 1.0)]
    assert budget.make_room(busy, 100) is None  # both busy: the load waits


def test_budget_counts_bytes() -> None:
    budget = Budget(max_loaded=4, max_memory=1000)
    old, new = Resident("old", 500, False, 1.0), Resident("new", 400, False, 2.0)
    assert budget.make_room([old, new], 200) == ["old"]
    assert budget.make_room([old, new], 50) == []
    assert budget.make_room([], 5000) == []  # too big for the budget, alone: still loads
    assert Budget.for_machine().max_loaded >= 1


class Logged(SimExecutor):
    """The simulated executor that notes which model ran each round."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__({})
        self.name, self.log = name, log

    def run(self, batch: Batch) -> list[int | None]:
        self.log.append(self.name)
        time.sleep(0.002)
        return super().run(batch)


def test_two_engines_with_work_alternate_rounds() -> None:
    turns, log = FairTurns(), []
    config = EngineConfig(max_running=1, max_prefill_tokens=16, kv_tokens=512, page_size=4)
    engines = [Engine(config, Logged(n, log), turns=turns).start() for n in "ab"]
    gate = threading.Barrier(2)
    handles = []

    def go(engine: Engine) -> None:
        gate.wait()
        handles.append(engine.submit(list(range(1, 5)),
                                     SamplingParams(max_tokens=60, ignore_eos=True)))
    threads = [threading.Thread(target=go, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in handles:
        list(h.events(timeout=20))
    for e in engines:
        e.stop()
    assert log.count("a") == log.count("b") == 60  # one round per output token each
    # while both had work the rounds took turns (a model waiting for its turn goes first);
    # slack for a thread that was not yet back at the turn queue on a loaded machine
    middle = log[5:-5]
    repeats = sum(x == y for x, y in itertools.pairwise(middle))
    assert repeats <= len(middle) // 10, "".join(log)

"""The engine facade over the simulated executor: threads, cancel, faults, bounds, shutdown."""
from __future__ import annotations

import threading
import time

import pytest

from engine.config import EngineConfig
from engine.runtime.engine import Engine, QueueFull
from engine.runtime.events import FinalEvent
from engine.runtime.handle import TextDelta
from engine.scheduling.batch import Batch
from engine.scheduling.request import RequestError, SamplingParams
from engine.sim.simulator import SimExecutor


class Paced(SimExecutor):
    """The simulated executor, slowed so rounds overlap with the test's actions; it can be
    told to raise on a chosen round (fault injection)."""

    def __init__(self, delay: float = 0.002, fail_on: int | None = None) -> None:
        super().__init__({})
        self.delay = delay
        self.fail_on = fail_on
        self.rounds = 0
        self.gate = threading.Event()
        self.gate.set()

    def run(self, batch: Batch) -> list[int | None]:
        self.gate.wait(10)
        self.rounds += 1
        time.sleep(self.delay)
        if self.rounds == self.fail_on:
            raise RuntimeError("injected fault")
        return super().run(batch)


def make(executor: Paced | None = None, **cfg: object) -> Engine:
    config = EngineConfig(**{"max_running": 2, "max_prefill_tokens": 16, "kv_tokens": 512,
                             "page_size": 4, **cfg})
    return Engine(config, executor or Paced()).start()


def finish(handle) -> FinalEvent:
    events = list(handle.events(timeout=10))
    assert isinstance(events[-1], FinalEvent)
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    return events[-1]


def assert_all_free(engine: Engine) -> None:
    assert engine.wait_idle(10)
    snap = engine.snapshot()
    assert snap.free_slots == snap.max_running and snap.kv.used == 0
    assert not snap.waiting and not snap.running


@pytest.fixture
def engine():
    e = make()
    yield e
    assert_all_free(e)
    e.stop()


def test_requests_complete_with_usage(engine: Engine) -> None:
    handles = [engine.submit([1, 2, 3, 4 + i], SamplingParams(max_tokens=5)) for i in range(5)]
    for h in handles:
        final = finish(h)
        assert final.finish_reason == "length"
        assert final.usage.prompt_tokens == 4 and final.usage.completion_tokens == 5
        assert final.timings.ttft is not None and final.timings.total >= final.timings.ttft
    assert engine.wait_idle(5)
    snap = engine.snapshot()
    assert snap.metrics.completed >= 5
    view = snap.find(handles[0].id)  # finished requests stay inspectable for a while
    assert view is not None and view.finish_reason == "length" and view.output_tokens == 5
    assert snap.rounds and all(set(r.decodes) <= {i for i, _ in r.batch} for r in snap.rounds)


def test_cancel_waiting_and_running_frees_everything() -> None:
    e = make(Paced(), kv_tokens=4096)
    try:
        long = SamplingParams(max_tokens=400)
        handles = [e.submit([1, 2, 3], long) for _ in range(4)]  # 2 run, 2 wait
        deadline = time.time() + 5
        while len(e.snapshot().running) < 2 and time.time() < deadline:
            time.sleep(0.01)
        snap = e.snapshot()
        assert {v.reason.code for v in snap.waiting if v.reason} <= {"slot", "behind"}
        assert [v.position for v in snap.waiting] == [1, 2]
        for h in handles:
            assert e.cancel(h.id) is True
        for h in handles:
            assert finish(h).finish_reason == "cancelled"
        assert e.cancel(handles[0].id) is False  # idempotent: nothing left to cancel
        assert_all_free(e)
    finally:
        e.stop()


def test_a_failed_round_fails_its_batch_only() -> None:
    ex = Paced(fail_on=3)
    e = make(ex)
    try:
        first = [e.submit([1, 2, 3], SamplingParams(max_tokens=20)) for _ in range(2)]
        finals = [finish(h) for h in first]
        assert [f.finish_reason for f in finals] == ["error", "error"]
        assert "injected fault" in (finals[0].error or "")
        assert_all_free(e)
        later = e.submit([5, 6, 7], SamplingParams(max_tokens=4))
        assert finish(later).finish_reason == "length"
        assert e.alive
    finally:
        e.stop()


def test_bounds_refuse_at_once() -> None:
    ex = Paced()
    ex.gate.clear()  # hold the first round so everything queues
    e = make(ex, max_waiting=3, max_running=1)
    try:
        with pytest.raises(RequestError, match=r"exceeds the context|never fit"):
            e.submit(list(range(600)), SamplingParams(max_tokens=10))
        hs = [e.submit([1, 2], SamplingParams(max_tokens=3), owner="ann", owner_limit=2)
              for _ in range(2)]
        with pytest.raises(QueueFull, match="ann already has 2"):
            e.submit([1, 2], SamplingParams(max_tokens=3), owner="ann", owner_limit=2)
        hs += [e.submit([1, 2], SamplingParams(max_tokens=3), owner="bob") for _ in range(2)]
        with pytest.raises(QueueFull, match="queue is full") as info:
            e.submit([1, 2], SamplingParams(max_tokens=3), owner="cy")
        assert info.value.retry_after >= 1
        ex.gate.set()
        assert all(finish(h).finish_reason == "length" for h in hs)
        assert e.snapshot().metrics.rejected == 2
        assert_all_free(e)
    finally:
        ex.gate.set()
        e.stop()


def test_stop_cancels_live_requests_and_keeps_their_output() -> None:
    e = make(kv_tokens=4096)
    h = e.submit([1, 2, 3], SamplingParams(max_tokens=4000), owner="x")
    deadline = time.time() + 5
    while time.time() < deadline and not any(v.output_tokens for v in e.snapshot().running):
        time.sleep(0.01)
    e.stop()
    final = finish(h)
    assert final.finish_reason == "cancelled"
    assert final.usage.completion_tokens >= 1


def test_reconfigure_changes_policy(engine: Engine) -> None:
    engine.reconfigure(policy="interleave", admission="fair")
    h = engine.submit([1, 2, 3], SamplingParams(max_tokens=2))
    finish(h)
    snap = engine.snapshot()
    assert (snap.policy, snap.admission) == ("interleave", "fair")
    with pytest.raises(ValueError):
        engine.reconfigure(policy="random")


@pytest.mark.parametrize("at_start", [False, True])
def test_grammar_compiler_built_at_start_only_when_asked(tokenizer: object,
                                                         at_start: bool) -> None:
    """A shared server builds the vocabulary view as the engine starts (building it holds
    Python's lock for half a second, which a user's first grammar must not cost the others);
    a local one at the first constrained request."""
    engine = Engine(EngineConfig(grammars_at_start=at_start), SimExecutor({}),
                    tokenizer).start()  # type: ignore[arg-type]
    try:
        assert engine.grammars_built is at_start
        engine.grammars()
        assert engine.grammars_built
    finally:
        engine.stop()

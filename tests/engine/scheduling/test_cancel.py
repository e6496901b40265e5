"""Cancel at round boundaries: waiting, mid-chunk and decoding requests, in the core and in
the simulator."""
from __future__ import annotations

import pytest
from sched_helpers import ids, make, round_at, sim

from engine.config import EngineConfig
from engine.runtime.core import EngineCore
from engine.scheduling.request import RequestState
from engine.sim.simulator import SimExecutor


# -- cancel ----------------------------------------------------------------------------------
@pytest.fixture(params=[False, True], ids=["no-cache", "prefix-cache"])
def core(request: pytest.FixtureRequest) -> EngineCore:
    """Two slots, 4-token chunks, 64 positions in 2-token pages; with and without the cache."""
    cfg = EngineConfig(max_running=2, max_prefill_tokens=4, kv_tokens=64, page_size=2,
                       prefix_cache=request.param)
    return EngineCore(cfg, SimExecutor({}), clock=lambda: 0.0)


def test_cancel_waiting_request(core: EngineCore) -> None:
    sched = core.scheduler
    core.submit(make("A", 2, 5))
    core.submit(make("B", 2, 5, base=10))
    core.submit(make("W", 2, 5, base=20))
    core.step()
    assert sched.slots.num_free == 0 and [r.id for r in sched.waiting] == ["W"]
    held = sched.kv.held
    req = core.cancel("W")
    assert req is not None and req.finish_reason == "cancelled" and req.num_outputs == 0
    assert sched.waiting == [] and sched.kv.held == held and sched.slots.num_free == 0
    assert core.cancel("W") is None  # idempotent
    sched.check_accounting()


def test_cancel_mid_chunk_frees_slot_and_pages(core: EngineCore) -> None:
    sched = core.scheduler
    core.submit(make("A", 10, 5))
    record = core.step()
    assert record is not None and ids(record.batch) == [("A", 4)]
    a = sched.live["A"]
    assert a.state is RequestState.CHUNKED and a.slot is not None and sched.kv.held == 4
    assert core.cancel("A") is a
    assert a.finish_reason == "cancelled" and a.slot is None and a.pages == []
    assert sched.slots.num_free == 2 and sched.kv.held == 0
    assert sched.waiting == [] and sched.chunked == []
    assert core.cancel("A") is None
    assert core.step() is None
    sched.check_accounting()


def test_cancel_decoding_request_keeps_its_outputs(core: EngineCore) -> None:
    sched = core.scheduler
    core.submit(make("A", 3, 10))
    core.step()
    core.step()
    a = sched.live["A"]
    assert a.state is RequestState.RUNNING and a.num_outputs == 2
    assert core.cancel("A") is a
    assert a.finish_reason == "cancelled" and a.num_outputs == 2
    assert sched.running == [] and sched.slots.num_free == 2 and sched.kv.held == 0
    assert core.cancel("A") is None
    assert core.cancel("never-submitted") is None
    sched.check_accounting()


def test_cancel_in_simulator_frees_in_that_round() -> None:
    engine = {"max_running": 2, "max_prefill_tokens": 4, "kv_tokens": 64, "page_size": 1,
              "prefix_cache": False}
    result = sim(engine, [
        {"id": "A", "prompt": 3, "output": 10, "cancel_at": 2},  # decoding at boundary 2
        {"id": "B", "prompt": 10, "output": 2, "cancel_at": 1.5},  # mid-chunk at boundary 2
        {"id": "C", "prompt": 2, "output": 2, "cancel_at": 0.5},  # waiting (no slot) at 1
        {"id": "D", "prompt": 1, "output": 1, "arrive": 1.5},
    ])
    r0, r1, r2 = (round_at(result, k) for k in (0, 1, 2))
    assert r0["batch"] == [{"id": "A", "tokens": 3}, {"id": "B", "tokens": 1}]
    assert r1["finished"] == ["C"] and "C" not in r1["waiting"]
    assert r1["free_slots"] == 0
    assert sorted(r2["finished"]) == ["A", "B", "D"]  # D: one output token, done at once
    assert r2["batch"] == [{"id": "D", "tokens": 1}]  # the freed slot is reused at once
    assert r2["running"] == [] and r2["free_slots"] == 2 and r2["kv_used"] == 0
    req = result["requests"]
    assert req["A"]["finish_reason"] == "cancelled" and req["A"]["finish_round"] == 2
    assert req["A"]["output_tokens"] == 1  # round 1 was B's chunk (prefill-first)
    assert req["B"]["finish_reason"] == "cancelled" and req["B"]["output_tokens"] == 0
    assert req["C"]["finish_reason"] == "cancelled" and req["C"]["finish_round"] == 1
    assert req["D"]["finish_reason"] == "length"


def test_cancels_apply_at_their_own_boundary_whatever_the_file_order() -> None:
    """A cancel that arrives before its request is applied when the request arrives; it must
    not hold back the other cancels (regression: cancels were sorted by cancel_at only)."""
    result = sim({"max_running": 4, "max_prefill_tokens": 64, "kv_tokens": 1000,
                  "page_size": 1, "prefix_cache": False},
                 [{"id": "X", "arrive": 5, "prompt": 2, "output": 3, "cancel_at": 0},
                  {"id": "Y", "prompt": 2, "output": 10, "cancel_at": 1}])
    assert result["requests"]["Y"]["finish_reason"] == "cancelled"
    assert result["requests"]["Y"]["finish_round"] == 1
    assert result["requests"]["Y"]["output_tokens"] == 1
    assert result["requests"]["X"]["finish_reason"] == "cancelled"
    assert result["requests"]["X"]["finish_round"] == 5
    assert result["requests"]["X"]["output_tokens"] == 0

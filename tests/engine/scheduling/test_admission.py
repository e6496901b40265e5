"""Admission (docs/architecture.md, Scheduling): the budget, slot and KV checks in order, the
worked KV example, impossible requests, and that the scheduler side needs no torch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sched_helpers import ids, make, round_at, sim, step

from engine.config import EngineConfig
from engine.scheduling.admission import Admission, kv_need, reservation
from engine.scheduling.request import Request, RequestError, RequestState
from engine.scheduling.scheduler import Scheduler
from engine.sim.scenario import parse
from engine.sim.simulator import Simulation

# -- the worked KV example----------------------------------------------------------------------
SHARED_256 = list(range(50_000, 50_256))


def _state_52(available: int, cached: bool) -> tuple[Scheduler, Request]:
    """Another request X has 1024 positions reserved (1025 max output, 1 produced) and the
    pool has `available` positions free; the candidate C has 768 uncached prompt tokens and
    max_tokens 256 (page_size 1). With `cached`, X's 256-token prompt is a prefix of C's
    1024-token prompt: locked by X, it costs C nothing and is not counted as available."""
    prompt_x = SHARED_256 if cached else list(range(10_000, 10_200))
    cfg = EngineConfig(max_running=4, max_prefill_tokens=1024, page_size=1, prefix_cache=cached,
                       kv_tokens=available + len(prompt_x))
    sched = Scheduler(cfg)
    sched.add(make("X", prompt_x, 1025))
    batch, _ = step(sched)
    assert ids(batch) == [("X", len(prompt_x))]
    assert sched.reservations() == 1024
    assert sched.kv.held == len(prompt_x)
    assert sched.kv.free + sched.kv.evictable == available
    prompt_c = (SHARED_256 if cached else []) + list(range(20_000, 20_768))
    cand = make("C", prompt_c, 256)
    sched.add(cand)
    return sched, cand


@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "cached-prefix"])
def test_chapter_52_candidate_waits_on_kv(cached: bool) -> None:
    sched, cand = _state_52(available=1800, cached=cached)
    match = sched.kv.match(cand, touch=False)
    assert match.num_tokens == (256 if cached else 0)
    assert kv_need(cand, match, 1) == 768 + 256
    assert sched.kv.available_with(match) == 1800
    check = Admission(sched.config, sched.kv, sched.slots, sched.running + sched.chunked)
    assert check.reserved == 1024
    reason = check.refuse(cand, match, budget=1024)
    assert reason is not None and reason.code == "kv"
    assert "2048" in reason.text and "1024" in reason.text and "1800" in reason.text
    # The scheduler agrees: the round is a decode of X, and C keeps waiting on KV.
    assert sched.wait_reasons()["C"].code == "kv"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "decode" and ids(batch) == [("X", 1)]
    assert cand.state is RequestState.WAITING and cand.slot is None
    assert sched.wait_reasons()["C"].code == "kv"


@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "cached-prefix"])
def test_chapter_52_candidate_fits_with_2048_available(cached: bool) -> None:
    sched, cand = _state_52(available=2048, cached=cached)
    check = Admission(sched.config, sched.kv, sched.slots, sched.running + sched.chunked)
    # 2048 <= 2048
    assert check.refuse(cand, sched.kv.match(cand, touch=False), budget=1024) is None
    assert sched.wait_reasons()["C"].code == "next"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "prefill" and ids(batch) == [("C", 768)]
    assert cand.num_cached == (256 if cached else 0)
    assert sched.reservations() == 1024 + 255  # X unchanged (it did not decode), C after 1 output


# -- each check, in order --------------------------------------------------------------------
def _scheduler(**fields: Any) -> Scheduler:
    """A scheduler with one-token pages and no prefix cache: positions and pages count alike."""
    return Scheduler(EngineConfig(page_size=1, prefix_cache=False, **fields))


def test_checks_run_in_order_budget_slot_kv() -> None:
    sched = _scheduler(max_running=1, max_prefill_tokens=8, kv_tokens=32)
    sched.add(make("X", 4, 20))
    step(sched)
    big = make("B", 8, 20)  # would also fail KV: 28 + 19 reserved > 28 available
    sched.add(big)
    check = Admission(sched.config, sched.kv, sched.slots, sched.running)
    match = sched.kv.match(big)
    assert check.refuse(big, match, budget=0).code == "budget"  # type: ignore[union-attr]
    assert check.refuse(big, match, budget=8).code == "slot"  # type: ignore[union-attr]
    check.free_slots = 1  # as if a slot were free: KV is the next check
    assert check.refuse(big, match, budget=8).code == "kv"  # type: ignore[union-attr]


def test_slot_check_and_head_of_line() -> None:
    sched = _scheduler(max_running=1, max_prefill_tokens=64, kv_tokens=1000)
    sched.add(make("A", 4, 3))
    step(sched)
    sched.add(make("B", 4, 2, base=100))
    sched.add(make("C", 1, 1, base=200))
    reasons = sched.wait_reasons()
    assert reasons["B"].code == "slot" and "1 of 1 slots" in reasons["B"].text
    assert reasons["C"].code == "behind" and "B" in reasons["C"].text
    assert ids(step(sched)[0]) == [("A", 1)]
    _, finished = step(sched)
    assert [r.id for r in finished] == ["A"]
    assert ids(step(sched)[0]) == [("B", 4)]  # the slot A freed goes to the head


def test_kv_head_of_line_blocks_smaller_requests_behind() -> None:
    sched = _scheduler(max_running=4, max_prefill_tokens=64, kv_tokens=40)
    sched.add(make("A", 10, 10))
    step(sched)  # A holds 10, reserves 9: 30 available, 21 left
    sched.add(make("B", 20, 10, base=100))  # needs 30 + 9 > 30
    sched.add(make("C", 1, 1, base=200))  # would fit, but FIFO stops at B
    reasons = sched.wait_reasons()
    assert reasons["B"].code == "kv" and reasons["C"].code == "behind"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "decode"


def test_budget_check_mixed_decodes_use_the_budget() -> None:
    sched = _scheduler(max_running=4, max_prefill_tokens=2, kv_tokens=1000, policy="mixed")
    sched.add(make("A", 1, 5))
    sched.add(make("B", 1, 5, base=100))
    assert ids(step(sched)[0]) == [("A", 1), ("B", 1)]
    sched.add(make("C", 1, 5, base=200))
    assert sched.wait_reasons()["C"].code == "budget"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "decode" and ids(batch) == [("A", 1), ("B", 1)]
    assert sched.waiting[0].id == "C" and sched.waiting[0].slot is None


def test_chunked_request_skips_slot_and_kv_checks() -> None:
    sched = _scheduler(max_running=1, max_prefill_tokens=4, kv_tokens=30)
    sched.add(make("A", 10, 20))  # 30 of 30: admitted, then no slot and no KV left
    assert ids(step(sched)[0]) == [("A", 4)]
    assert sched.slots.num_free == 0
    assert sched.wait_reasons()["A"].code == "chunk"
    assert ids(step(sched)[0]) == [("A", 4)]
    assert ids(step(sched)[0]) == [("A", 2)]
    assert sched.running[0].id == "A" and sched.running[0].num_outputs == 1


# -- impossible requests ---------------------------------------------------------------------
def test_impossible_requests_fail_at_once_and_do_not_block() -> None:
    result = sim({"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 1000, "page_size": 4,
                  "prefix_cache": False, "max_context": 80},
                 [{"id": "ctx", "prompt": 70, "output": 11},  # 81 > context of 80
                  {"id": "ok", "prompt": 4, "output": 2},
                  {"id": "ctx2", "arrive": 1, "prompt": 81, "output": 1},
                  {"id": "ok2", "arrive": 1, "prompt": 4, "output": 2}])
    req = result["requests"]
    assert req["ctx"]["finish_reason"] == "error" and req["ctx"]["finish_round"] == 0
    assert req["ctx"]["output_tokens"] == 0 and "context" in req["ctx"]["error"]
    assert req["ctx2"]["finish_reason"] == "error" and req["ctx2"]["finish_round"] == 1
    assert req["ok"]["finish_reason"] == "length" and req["ok"]["first_token_round"] == 0
    assert req["ok2"]["finish_reason"] == "length" and req["ok2"]["first_token_round"] == 1
    for r in result["rounds"]:
        for rid in ("ctx", "ctx2"):
            assert rid not in r["waiting"] and rid not in r["running"]
            assert all(b["id"] != rid for b in r["batch"])
    assert round_at(result, 0)["finished"] == ["ctx"]
    assert "ctx2" in round_at(result, 1)["finished"]


def test_request_larger_than_the_pool_fails_at_once() -> None:
    result = sim({"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 64, "page_size": 4,
                  "prefix_cache": True},
                 [{"id": "ok", "prompt": 4, "output": 3},
                  {"id": "big", "prompt": 60, "output": 10},  # 70 > 64 positions
                  {"id": "after", "prompt": 4, "output": 2}])
    req = result["requests"]
    assert req["big"]["finish_reason"] == "error" and req["big"]["output_tokens"] == 0
    assert "KV pool" in req["big"]["error"]
    assert req["ok"]["finish_reason"] == "length" and req["after"]["finish_reason"] == "length"
    assert round_at(result, 0)["batch"] == [{"id": "ok", "tokens": 4}, {"id": "after", "tokens": 4}]


def test_scheduler_refuses_impossible_requests() -> None:
    sched = Scheduler(EngineConfig(max_running=2, kv_tokens=64, page_size=4, max_context=50))
    with pytest.raises(RequestError, match="context"):
        sched.add(make("a", 40, 11))
    sched2 = Scheduler(EngineConfig(max_running=2, kv_tokens=64, page_size=4, max_context=500))
    with pytest.raises(RequestError, match="KV pool"):
        sched2.add(make("b", 60, 5))
    with pytest.raises(RequestError, match="empty"):
        sched2.add(make("c", [], 5))
    assert not sched.live and not sched2.live and sched2.waiting == []


def test_no_torch_imported() -> None:
    """The scheduler side must run without torch (scheduler tests need none)."""
    Simulation(parse({"requests": [{"id": "A", "prompt": 2, "output": 2}]})).run()
    assert reservation(make("r", 2, 2), 1) == 2 + 2 + 0
    code = ("import sys; import engine.sim.simulator, engine.runtime.core, "
            "engine.scheduling.scheduler, engine.speculative, engine.kernels.cpu_level; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], check=False,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, "importing the scheduler side pulled in torch"


def test_duplicate_prompt_pages_do_not_eat_reserved_kv() -> None:
    """Regression: X and Y share a prompt prefix and are admitted in the same round, so Y
    computes its own copy. X finishes first (its pages become unlocked cache); when Y's prompt
    completes, Y must not lock X's cached copies on top of its own pages, or the pool loses
    positions that Z's reservation counted as evictable and a decode runs out of pages."""
    result = sim({"max_running": 4, "max_prefill_tokens": 6, "kv_tokens": 13, "page_size": 1,
                  "prefix_cache": True},
                 [{"id": "X", "prompt_ids": [1, 2, 3, 4], "output": 1},
                  {"id": "Y", "prompt_ids": [1, 2, 3, 4, 5], "output": 3},
                  {"id": "Z", "arrive": 0.5, "prompt": 1, "output": 4}])
    assert round_at(result, 0)["batch"] == [{"id": "X", "tokens": 4}, {"id": "Y", "tokens": 2}]
    assert round_at(result, 1)["batch"] == [{"id": "Y", "tokens": 3}, {"id": "Z", "tokens": 1}]
    for rid, out in (("X", 1), ("Y", 3), ("Z", 4)):
        assert result["requests"][rid]["finish_reason"] == "length"
        assert result["requests"][rid]["output_tokens"] == out
    for r in result["rounds"]:
        assert r["kv_used"] <= 13

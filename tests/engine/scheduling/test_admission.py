"""Admission (design.md §3.2): the budget, slot and KV checks, prefix-cache hits, eviction,
wait reasons, cancel, impossible requests, and scenario validation. No torch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.runtime.core import EngineCore
from engine.scheduling.admission import Admission, kv_need, reservation
from engine.scheduling.batch import Batch
from engine.scheduling.request import Request, RequestError, RequestState, SamplingParams
from engine.scheduling.scheduler import Scheduler
from engine.sim.scenario import ScenarioError, parse
from engine.sim.simulator import SimExecutor, Simulation, cli, simulate


# -- helpers ---------------------------------------------------------------------------------
def make(rid: str, prompt: int | list[int], max_tokens: int, base: int = 0) -> Request:
    ids = list(prompt) if isinstance(prompt, list) else list(range(base, base + prompt))
    return Request(ids, SamplingParams(max_tokens=max_tokens), id=rid)


def step(sched: Scheduler, now: float = 0.0) -> tuple[Batch | None, list[Request]]:
    """One round against a fake executor that samples token 0 (never EOS)."""
    batch = sched.select(now)
    if batch is None:
        return None, []
    tokens = [0 if item.sample else None for item in batch.items]
    finished = sched.process(batch, tokens, now)
    sched.check_accounting()
    return batch, finished


def ids(batch: Batch | None) -> list[tuple[str, int]]:
    return [] if batch is None else [(it.request.id, it.num_tokens) for it in batch.items]


def sim(engine: dict, requests: list[dict]) -> dict:
    return simulate(parse({"engine": engine, "requests": requests}))


def round_at(result: dict, k: int) -> dict:
    return next(r for r in result["rounds"] if r["round"] == k)


# -- §5.2 arithmetic -------------------------------------------------------------------------
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
    assert check.refuse(cand, sched.kv.match(cand, touch=False), budget=1024) is None  # 2048 <= 2048
    assert sched.wait_reasons()["C"].code == "next"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "prefill" and ids(batch) == [("C", 768)]
    assert cand.num_cached == (256 if cached else 0)
    assert sched.reservations() == 1024 + 255  # X unchanged (it did not decode), C after 1 output


# -- each check, in order --------------------------------------------------------------------
def test_checks_run_in_order_budget_slot_kv() -> None:
    cfg = EngineConfig(max_running=1, max_prefill_tokens=8, kv_tokens=32, page_size=1,
                       prefix_cache=False)
    sched = Scheduler(cfg)
    sched.add(make("X", 4, 20))
    step(sched)
    big = make("B", 8, 20)  # would also fail KV: 28 + 19 reserved > 28 available
    sched.add(big)
    check = Admission(cfg, sched.kv, sched.slots, sched.running)
    match = sched.kv.match(big)
    assert check.refuse(big, match, budget=0).code == "budget"  # type: ignore[union-attr]
    assert check.refuse(big, match, budget=8).code == "slot"  # type: ignore[union-attr]
    check.free_slots = 1  # as if a slot were free: KV is the next check
    assert check.refuse(big, match, budget=8).code == "kv"  # type: ignore[union-attr]


def test_slot_check_and_head_of_line() -> None:
    cfg = EngineConfig(max_running=1, max_prefill_tokens=64, kv_tokens=1000, page_size=1,
                       prefix_cache=False)
    sched = Scheduler(cfg)
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
    cfg = EngineConfig(max_running=4, max_prefill_tokens=64, kv_tokens=40, page_size=1,
                       prefix_cache=False)
    sched = Scheduler(cfg)
    sched.add(make("A", 10, 10))
    step(sched)  # A holds 10, reserves 9: 30 available, 21 left
    sched.add(make("B", 20, 10, base=100))  # needs 30 + 9 > 30
    sched.add(make("C", 1, 1, base=200))  # would fit, but FIFO stops at B
    reasons = sched.wait_reasons()
    assert reasons["B"].code == "kv" and reasons["C"].code == "behind"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "decode"


def test_budget_check_mixed_decodes_use_the_budget() -> None:
    cfg = EngineConfig(max_running=4, max_prefill_tokens=2, kv_tokens=1000, page_size=1,
                       prefix_cache=False, policy="mixed")
    sched = Scheduler(cfg)
    sched.add(make("A", 1, 5))
    sched.add(make("B", 1, 5, base=100))
    assert ids(step(sched)[0]) == [("A", 1), ("B", 1)]
    sched.add(make("C", 1, 5, base=200))
    assert sched.wait_reasons()["C"].code == "budget"
    batch, _ = step(sched)
    assert batch is not None and batch.phase == "decode" and ids(batch) == [("A", 1), ("B", 1)]
    assert sched.waiting[0].id == "C" and sched.waiting[0].slot is None


def test_chunked_request_skips_slot_and_kv_checks() -> None:
    cfg = EngineConfig(max_running=1, max_prefill_tokens=4, kv_tokens=30, page_size=1,
                       prefix_cache=False)
    sched = Scheduler(cfg)
    sched.add(make("A", 10, 20))  # 30 of 30: admitted, then no slot and no KV left
    assert ids(step(sched)[0]) == [("A", 4)]
    assert sched.slots.num_free == 0
    assert sched.wait_reasons()["A"].code == "chunk"
    assert ids(step(sched)[0]) == [("A", 4)]
    assert ids(step(sched)[0]) == [("A", 2)]
    assert sched.running[0].id == "A" and sched.running[0].num_outputs == 1


# -- prefix cache ----------------------------------------------------------------------------
SYSTEM = list(range(100, 116))  # 16 ids: four pages of 4


def _prefix_scenario(second: list[int]) -> dict:
    """A (16-token prompt) still decodes when B arrives; pool of 48 positions, pages of 4."""
    return sim({"max_running": 4, "max_prefill_tokens": 64, "kv_tokens": 48, "page_size": 4,
                "prefix_cache": True},
               [{"id": "A", "prompt_ids": SYSTEM, "output": 8},
                {"id": "B", "arrive": 0.5, "prompt_ids": second, "output": 4}])


def test_prefix_hit_reduces_prefill_and_kv_estimate() -> None:
    hit = _prefix_scenario(SYSTEM + [7, 7, 7, 7])
    miss = _prefix_scenario(list(range(200, 220)))  # same length, nothing shared
    # With the hit, B computes only its own page (20 - 16 cached) and is admitted at once:
    # needs 4 + 4 + 3 = 11 (+ A's 10 reserved) <= 28 free.
    r1 = round_at(hit, 1)
    assert r1["phase"] == "prefill" and r1["batch"] == [{"id": "B", "tokens": 4}]
    assert r1["kv_used"] == 16 + 4  # A's prompt pages are shared, not copied
    assert hit["requests"]["B"]["first_token_round"] == 1
    # Without it, B needs 20 + 4 + 3 + 10 = 37 > 28 and waits on KV until A is done.
    m1 = round_at(miss, 1)
    assert m1["phase"] == "decode" and m1["waiting_reasons"]["B"]["code"] == "kv"
    first_b = next(r for r in miss["rounds"] if any(b["id"] == "B" for b in r["batch"]))
    assert first_b["batch"] == [{"id": "B", "tokens": 20}]
    assert first_b["round"] > miss["requests"]["A"]["finish_round"]
    for result in (hit, miss):
        assert {q["finish_reason"] for q in result["requests"].values()} == {"length"}


def test_prefix_match_is_page_aligned() -> None:
    # 18 shared ids hit 4 whole pages (16); the 2 shared ids of the partial page are computed.
    result = sim({"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 256, "page_size": 4,
                  "prefix_cache": True},
                 [{"id": "A", "prompt_ids": SYSTEM + [1, 2, 3], "output": 1},
                  {"id": "B", "arrive": 1, "prompt_ids": SYSTEM + [1, 2, 9, 9, 9], "output": 1}])
    assert round_at(result, 1)["batch"] == [{"id": "B", "tokens": 21 - 16}]


@pytest.mark.parametrize("page_size", [1, 2, 4, 8])
def test_prefix_match_leaves_the_last_prompt_token(page_size: int) -> None:
    """A prompt equal to a cached prompt of whole pages still computes >= 1 token."""
    result = sim({"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 256,
                  "page_size": page_size, "prefix_cache": True},
                 [{"id": "A", "prompt_ids": SYSTEM, "output": 2},
                  {"id": "B", "arrive": 5, "prompt_ids": SYSTEM, "output": 2}])
    batch = round_at(result, 5)["batch"]
    assert batch == [{"id": "B", "tokens": page_size}]  # (16 - 1) // ps whole pages hit
    assert result["requests"]["B"]["first_token_round"] == 5


def test_prefix_cache_evicts_unlocked_lru_leaves_on_demand() -> None:
    cfg = EngineConfig(max_running=2, max_prefill_tokens=64, kv_tokens=16, page_size=2,
                       prefix_cache=True)
    sched = Scheduler(cfg)
    kv = sched.kv
    a, b = [1, 2, 3, 4], [11, 12, 13, 14]
    sched.add(make("A", a, 1))
    step(sched)
    sched.add(make("B", b, 1))
    step(sched)
    assert kv.held == 0 and kv.evictable == 8 and kv.free == 8  # A then B cached, unlocked
    sched.add(make("C", list(range(31, 39)), 3))  # 8 + 3 + 1 = 12 <= 16: admitted
    step(sched)
    c = sched.running[0]
    assert kv.free == 0 and kv.held == 8  # C's four prompt pages, locked in the cache
    # C's decode needs a fifth page: the least recently used unlocked leaf (A's 2nd page) goes.
    step(sched)
    assert kv.cache is not None
    assert len(kv.cache.match(a, 2, touch=False)[1]) == 1
    assert len(kv.cache.match(b, 2, touch=False)[1]) == 2
    # Evicting everything evictable leaves C's locked prompt pages in place.
    kv.cache.evict(100, kv.allocator.free)
    assert kv.evictable == 0
    assert kv.cache.match(a, 2, touch=False)[1] == [] and kv.cache.match(b, 2, touch=False)[1] == []
    assert kv.cache.match(c.prompt_ids, 4, touch=False)[1] == c.pages[:4]
    sched.check_accounting()
    step(sched)  # C's last token
    assert not sched.live and kv.held == 0
    sched.check_accounting()


def test_locked_prefix_is_not_counted_as_available() -> None:
    """A live request's prompt pages are locked: admission cannot count them as evictable."""
    cfg = EngineConfig(max_running=2, max_prefill_tokens=64, kv_tokens=16, page_size=2,
                       prefix_cache=True)
    sched = Scheduler(cfg)
    sched.add(make("A", list(range(1, 9)), 4))  # 8 + 4 + 1 = 13
    step(sched)
    assert sched.kv.evictable == 0 and sched.kv.held == 8
    assert sched.kv.free == 8
    sched.add(make("B", 3, 1, base=100))  # 3 + 1 + 1 = 5, + A's 3 + 1 reserved = 9 > 8 free
    reason = sched.wait_reasons()["B"]
    assert reason.code == "kv" and "8 available" in reason.text, reason
    while "A" in sched.live:
        batch, _ = step(sched)
        assert batch is not None and [it.request.id for it in batch.items] == ["A"]
    # A's pages are now unlocked cache: evictable, so B fits.
    assert sched.kv.evictable > 0 and sched.wait_reasons()["B"].code == "next"
    assert ids(step(sched)[0]) == [("B", 3)]
    sched.check_accounting()


# -- wait reasons in the simulator's JSON ----------------------------------------------------
def _reasons(result: dict, rid: str) -> list[dict]:
    return [r["waiting_reasons"][rid] for r in result["rounds"] if rid in r["waiting_reasons"]]


def test_wait_reason_codes_in_json() -> None:
    slot = sim({"max_running": 1, "max_prefill_tokens": 64, "kv_tokens": 1000, "page_size": 1,
                "prefix_cache": False},
               [{"id": "A", "prompt": 3, "output": 3}, {"id": "B", "prompt": 2, "output": 1},
                {"id": "C", "prompt": 2, "output": 1}])
    b, c = _reasons(slot, "B")[0], _reasons(slot, "C")[0]
    assert b["code"] == "slot" and "slot" in b["text"]
    assert c["code"] == "behind" and "B" in c["text"]

    kv = _prefix_scenario(list(range(200, 220)))
    reason = round_at(kv, 1)["waiting_reasons"]["B"]
    assert reason["code"] == "kv" and "KV" in reason["text"] and "available" in reason["text"]

    chunk = sim({"max_running": 3, "max_prefill_tokens": 1024, "kv_tokens": 100000,
                 "page_size": 1, "prefix_cache": False},
                [{"id": "B", "prompt": 10, "output": 5},
                 {"id": "C", "arrive": 0.5, "prompt": 2500, "output": 2},
                 {"id": "D", "arrive": 0.5, "prompt": 5, "output": 1}])
    r1 = round_at(chunk, 1)
    assert r1["batch"] == [{"id": "C", "tokens": 1024}]
    assert r1["waiting"] == ["C", "D"]
    assert r1["waiting_reasons"]["C"]["code"] == "chunk"
    assert "2 of 3" in r1["waiting_reasons"]["C"]["text"]
    assert "1024 of 2500" in r1["waiting_reasons"]["C"]["text"]
    assert r1["waiting_reasons"]["D"]["code"] == "budget"
    assert "1024" in r1["waiting_reasons"]["D"]["text"]
    # D gets the budget C's last chunk leaves (1024 - 452).
    r3 = round_at(chunk, 3)
    assert r3["batch"] == [{"id": "C", "tokens": 452}, {"id": "D", "tokens": 5}]
    for result in (slot, kv, chunk):
        for r in result["rounds"]:
            assert set(r["waiting_reasons"]) == set(r["waiting"])
            for reason in r["waiting_reasons"].values():
                assert reason["text"].strip(), reason


# -- cancel ----------------------------------------------------------------------------------
def _cancel_setup(prefix_cache: bool) -> tuple[EngineCore, list[float]]:
    cfg = EngineConfig(max_running=2, max_prefill_tokens=4, kv_tokens=64, page_size=2,
                       prefix_cache=prefix_cache)
    now = [0.0]
    core = EngineCore(cfg, SimExecutor({}), clock=lambda: now[0])
    return core, now


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_cancel_waiting_request(prefix_cache: bool) -> None:
    core, _ = _cancel_setup(prefix_cache)
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


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_cancel_mid_chunk_frees_slot_and_pages(prefix_cache: bool) -> None:
    core, _ = _cancel_setup(prefix_cache)
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


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_cancel_decoding_request_keeps_its_outputs(prefix_cache: bool) -> None:
    core, _ = _cancel_setup(prefix_cache)
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


# -- scenario validation ---------------------------------------------------------------------
GOOD_ENGINE = {"max_running": 2, "max_prefill_tokens": 8, "kv_tokens": 100, "page_size": 1}


@pytest.mark.parametrize("data, field", [
    ({"engine": GOOD_ENGINE, "requests": [], "bogus": 1}, "bogus"),
    ({"engine": {**GOOD_ENGINE, "max_runing": 3}, "requests": []}, "max_runing"),
    ({"engine": GOOD_ENGINE, "requests": [{"id": "A", "prompt": 3, "output": 1, "promt": 3}]},
     "promt"),
])
def test_unknown_fields_are_refused(data: dict, field: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ScenarioError, match=field):
        parse(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert cli([str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert field in captured.err and "ferry simulate" in captured.err


@pytest.mark.parametrize("data, words", [
    ({"engine": {**GOOD_ENGINE, "policy": "lifo"}, "requests": []}, "policy"),
    ({"requests": [{"id": "A", "output": 1}]}, "prompt"),
    ({"requests": [{"id": "A", "prompt": 2, "prompt_ids": [1], "output": 1}]}, "prompt"),
    ({"requests": [{"id": "A", "prompt": 0, "output": 1}]}, "prompt"),
    ({"requests": [{"id": "A", "prompt": 2}]}, "output"),
    ({"requests": [{"id": "A", "prompt": 2, "output": 1}, {"id": "A", "prompt": 1, "output": 1}]},
     "twice"),
    ({"requests": [{"id": "A", "prompt": 2, "output": 1, "arrive": -1}]}, "arrive"),
    ({"requests": "A"}, "requests"),
])
def test_malformed_scenarios_are_refused(data: dict, words: str) -> None:
    with pytest.raises(ScenarioError, match=words):
        parse(data)


def test_cli_reports_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli([str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_no_torch_imported() -> None:
    """The scheduler side must run without torch (design.md §1: scheduler tests need none)."""
    Simulation(parse({"requests": [{"id": "A", "prompt": 2, "output": 2}]})).run()
    assert reservation(make("r", 2, 2), 1) == 2 + 2 + 0
    code = ("import sys; import engine.sim.simulator, engine.runtime.core, "
            "engine.scheduling.scheduler; "
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

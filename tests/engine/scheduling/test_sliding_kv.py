"""The local (sliding-window) layers' pool in the scheduler: pages outside the window go back,
a request never holds more than its window plus one round's new tokens, admission checks the
local pool too, and cancel returns pages of both kinds. No torch."""
from __future__ import annotations

import pytest
from sched_helpers import make, step

from engine.config import EngineConfig
from engine.scheduling.request import RequestState
from engine.scheduling.scheduler import Scheduler


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = {"max_running": 2, "max_prefill_tokens": 6, "kv_tokens": 4096,
                               "page_size": 4, "sliding_window": 8}
    return EngineConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_local_pool_size_and_cap() -> None:
    cfg = config()
    # window 8 + one round of 6 new tokens, unaligned: ceil(13 / 4) + 1 = 5 pages
    assert cfg.local_pages_per_request == 5 and cfg.num_local_pages == 10
    assert EngineConfig().num_local_pages == 0
    sched = Scheduler(cfg)
    assert sched.local is not None and sched.local.total == 40
    assert sched.local.cap(make("S", 3, 2)) == 2  # a short request: its whole length
    assert sched.local.cap(make("L", 100, 50)) == 5
    assert sched.kv.cache is None  # no prefix cache with local layers


def test_long_request_holds_its_window_only() -> None:
    """A 40-token prompt in 6-token chunks, then 60 decodes: after every round the request
    holds the local pages from the one its next query sees, never more than its cap; the
    global pool keeps every position."""
    sched = Scheduler(config())
    sched.add(make("A", 40, 60))
    local = sched.local
    assert local is not None
    rounds = 0
    while sched.live:
        step(sched)
        rounds += 1
        if "A" not in sched.live:
            break
        a = sched.live["A"]
        first = max(0, a.num_computed - 8 + 1) // 4
        assert a.local_first == first
        # pages up to the last computed position, from the first the window reaches
        assert len(a.local_pages) == -(-a.num_computed // 4) - first
        assert len(a.local_pages) <= local.cap(a) == 5
        assert local.held == len(a.local_pages) * 4
        assert sched.kv.held == -(-a.num_computed // 4) * 4  # global: all of it
    assert rounds == 7 + 59  # ceil(40 / 6) prefill rounds, the first token among them
    assert local.held == 0 and local.free == local.total and sched.kv.held == 0
    sched.check_accounting()


def test_admission_checks_the_local_pool() -> None:
    """Local pages for two long requests only (local_kv_tokens): the third waits on KV,
    reason local, though the global pool has room; it enters once one is cancelled."""
    cfg = config(max_running=3, max_prefill_tokens=4, local_kv_tokens=32)
    assert cfg.local_pages_per_request == 4 and cfg.num_local_pages == 8  # ceil(11/4) + 1
    # never below one request's most, never above the global pool
    assert config(max_running=3, max_prefill_tokens=4, local_kv_tokens=4).num_local_pages == 4
    assert config(kv_tokens=16, local_kv_tokens=400).num_local_pages == 4
    sched = Scheduler(cfg)
    local = sched.local
    assert local is not None
    for rid in "ABC":
        sched.add(make(rid, 4, 20, base=ord(rid) * 10))
    for _ in range(3):
        step(sched)
    assert {r.id for r in sched.running} == {"A", "B"}
    reasons = sched.wait_reasons()
    assert sched.live["C"].state is RequestState.WAITING and reasons["C"].code == "kv"
    assert "local-layer KV positions" in reasons["C"].text
    assert sched.kv.free >= 2 * (4 + 20 + 3)  # the global pool alone would admit C
    for _ in range(5):
        step(sched)
        assert local.held <= local.total and sched.live["C"].state is RequestState.WAITING
    sched.cancel("A", 0.0)
    step(sched)
    assert sched.live["C"].state is not RequestState.WAITING
    sched.check_accounting()


@pytest.mark.parametrize("state", ["chunked", "running"])
def test_cancel_returns_pages_of_both_kinds(state: str) -> None:
    sched = Scheduler(config())
    sched.add(make("A", 30, 20))
    step(sched)
    if state == "running":
        while sched.live["A"].state is not RequestState.RUNNING:
            step(sched)
        for _ in range(5):
            step(sched)
    a = sched.live["A"]
    assert a.local_pages and a.pages
    assert sched.cancel("A", 0.0) is a
    assert a.pages == [] and a.local_pages == [] and a.local_first == 0
    assert sched.kv.held == 0 and sched.local is not None and sched.local.held == 0
    assert sched.local.allocator.num_free == sched.local.total_pages
    sched.check_accounting()


def test_mixed_policy_rounds_stay_within_the_cap() -> None:
    """Decodes and prefill chunks in one round, requests of every length: the local pool's
    free + held == total after each round and nobody exceeds its cap (check_accounting)."""
    sched = Scheduler(config(max_running=4, max_prefill_tokens=5, policy="mixed",
                             kv_tokens=1024, page_size=2, sliding_window=5))
    for i, (p, out) in enumerate([(17, 9), (3, 30), (9, 1), (25, 12), (2, 2), (11, 7)]):
        sched.add(make(f"R{i}", p, out, base=i * 50))
    for _ in range(200):
        if not sched.live:
            break
        step(sched)  # asserts the accounting of both pools
    assert not sched.live
    assert sched.local is not None and sched.local.held == 0 and sched.kv.held == 0


def test_simulator_takes_the_window_from_the_scenario() -> None:
    from sched_helpers import sim

    result = sim({"max_running": 1, "max_prefill_tokens": 8, "kv_tokens": 256,
                  "page_size": 4, "sliding_window": 8},
                 [{"id": "A", "prompt": 20, "output": 30}])
    assert result["requests"]["A"]["output_tokens"] == 30

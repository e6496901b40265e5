"""Admission with the prefix cache: hits cut prefill and the KV estimate, matches are
page-aligned and leave the last prompt token, eviction of unlocked leaves, locked prefixes."""
from __future__ import annotations

import pytest
from sched_helpers import SYSTEM, ids, make, prefix_scenario, round_at, sim, step

from engine.config import EngineConfig
from engine.scheduling.scheduler import Scheduler


# -- prefix cache ----------------------------------------------------------------------------
def test_prefix_hit_reduces_prefill_and_kv_estimate() -> None:
    hit = prefix_scenario(SYSTEM + [7, 7, 7, 7])
    miss = prefix_scenario(list(range(200, 220)))  # same length, nothing shared
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

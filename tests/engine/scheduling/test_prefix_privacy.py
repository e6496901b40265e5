"""The prefix cache scoped by owner (a shared server): no request hits another owner's pages,
each owner still hits its own, and all scopes share one pool and one LRU eviction order.
Without the scope (a local server) every request shares one cache. No torch."""
from __future__ import annotations

from sched_helpers import make, step

from engine.config import EngineConfig
from engine.scheduling.prefix_cache import PrefixCache
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler

PROMPT = list(range(1, 10))  # two whole pages of 4 to hit, the last token always computed


def owned(rid: str, owner: str, prompt: list[int], max_tokens: int = 1) -> Request:
    req = make(rid, prompt, max_tokens)
    req.owner = owner
    return req


def run(sched: Scheduler, req: Request) -> Request:
    """Admit `req` and run it to the end; the scheduler's accounting checked every round."""
    sched.add(req)
    while req.id in sched.live:
        step(sched)
    return req


def scheduler(per_owner: bool, kv_tokens: int = 64) -> Scheduler:
    return Scheduler(EngineConfig(max_running=4, max_prefill_tokens=64, kv_tokens=kv_tokens,
                                  page_size=4, prefix_cache=True,
                                  prefix_cache_per_owner=per_owner))


def test_per_owner_no_hit_on_another_owners_prompt() -> None:
    sched = scheduler(per_owner=True)
    assert run(sched, owned("a1", "alice", PROMPT)).num_cached == 0
    assert run(sched, owned("b1", "bob", PROMPT)).num_cached == 0  # alice's pages: no hit
    assert run(sched, owned("a2", "alice", PROMPT)).num_cached == 8  # her own: a hit
    assert run(sched, owned("b2", "bob", PROMPT)).num_cached == 8  # bob's own copy now
    assert sched.kv.held == 0 and not sched.live


def test_shared_cache_hits_across_owners() -> None:
    """A local server (no scope): one cache, whoever sent the prompt first."""
    sched = scheduler(per_owner=False)
    run(sched, owned("a1", "alice", PROMPT))
    assert run(sched, owned("b1", "bob", PROMPT)).num_cached == 8


def test_concurrent_owners_never_share_a_locked_prefix() -> None:
    """While alice's request holds its prompt pages, bob's identical prompt computes its own."""
    sched = scheduler(per_owner=True)
    a = owned("a", "alice", PROMPT, max_tokens=4)
    sched.add(a)
    step(sched)  # alice's prompt is in the cache, locked
    b = owned("b", "bob", PROMPT, max_tokens=4)
    sched.add(b)
    step(sched)
    assert b.num_cached == 0 and set(a.pages).isdisjoint(b.pages)
    while sched.live:
        step(sched)
    assert sched.kv.held == 0


def test_scopes_share_one_pool_and_evict_lru() -> None:
    """Alice's cached pages are evicted for bob's request when the pool is full: one pool,
    so a scope never strands memory, and bob's request runs."""
    sched = scheduler(per_owner=True, kv_tokens=16)  # four pages
    run(sched, owned("a", "alice", list(range(1, 13)), max_tokens=1))  # 12 + 1: three cached
    kv = sched.kv
    assert kv.cache is not None and kv.evictable == 12
    run(sched, owned("b", "bob", list(range(101, 110)), max_tokens=3))  # needs 3 of 4 pages
    # bob's request took pages alice's cache held: fewer of hers are left
    assert len(kv.cache.match(list(range(1, 13)), 3, touch=False, scope="alice")[1]) < 3
    assert kv.free + kv.evictable == kv.total and kv.held == 0
    sched.check_accounting()


def test_cache_scopes_are_separate_trees() -> None:
    cache = PrefixCache(page_size=2)
    freed: list[int] = []
    cache.insert([1, 2, 3, 4], [10, 11], cache.root_for("alice"), freed.append)
    assert cache.match([1, 2, 3, 4], 2, scope="alice")[1] == [10, 11]
    assert cache.match([1, 2, 3, 4], 2, scope="bob")[1] == []
    assert cache.match([1, 2, 3, 4], 2)[1] == []  # the default (shared) scope is another tree
    # bob's identical prompt gets nodes of his own, over his own pages (no page is freed)
    cache.insert([1, 2, 3, 4], [20, 21], cache.root_for("bob"), freed.append)
    assert cache.match([1, 2, 3, 4], 2, scope="bob")[1] == [20, 21] and freed == []
    assert cache.num_pages == 4 and cache.num_evictable == 4
    assert cache.evict(10, freed.append) == 4 and sorted(freed) == [10, 11, 20, 21]
    assert cache.num_pages == 0 and set(cache.roots) == {"", "alice", "bob"}  # roots stay

"""Embedding requests in the scheduler: prefill-only, never split across rounds (an encoder
attends both ways over the whole input), batched whole, never in the prefix cache."""
from __future__ import annotations

import pytest
from sched_helpers import ids, step

from engine.config import EngineConfig
from engine.scheduling.request import Request, RequestError, SamplingParams
from engine.scheduling.scheduler import Scheduler

EMBED = SamplingParams(max_tokens=0, embed=True)


def embedding(rid: str, n: int, base: int = 0) -> Request:
    return Request(list(range(base, base + n)), EMBED, id=rid)


def test_inputs_run_whole_and_wait_for_a_round_with_room() -> None:
    sched = Scheduler(EngineConfig(max_running=4, max_prefill_tokens=10, kv_tokens=64,
                                   page_size=4, prefix_cache=True))
    for rid, n in (("A", 6), ("B", 6), ("C", 3), ("D", 4)):
        sched.add(embedding(rid, n))
    rounds = []
    while sched.has_work:
        batch, finished = step(sched)
        assert batch is not None and not any(it.sample for it in batch.items)
        rounds.append((ids(batch), [r.id for r in finished]))
    # B does not fit beside A: it waits (FIFO: C and D wait behind it), never split
    assert rounds == [([("A", 6)], ["A"]), ([("B", 6), ("C", 3)], ["B", "C"]),
                      ([("D", 4)], ["D"])]
    assert sched.kv.free == sched.kv.total and sched.slots.num_free == 4
    assert sched.kv.cache is not None and sched.kv.evictable == 0  # nothing was cached


def test_an_input_over_the_round_budget_is_refused() -> None:
    sched = Scheduler(EngineConfig(max_prefill_tokens=8, kv_tokens=64, page_size=4))
    with pytest.raises(RequestError, match="prefill budget of 8"):
        sched.add(embedding("A", 9))


def test_embed_needs_no_prompt_scoring() -> None:
    assert SamplingParams(max_tokens=0, embed=True).embed
    with pytest.raises(RequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)

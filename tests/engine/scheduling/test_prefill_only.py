"""Requests that score their prompt: max_tokens 0 finishes after the prefill (chunked or
not) without sampling and frees everything; a scored prompt never reuses cached pages."""
from __future__ import annotations

import pytest
from sched_helpers import make, step

from engine.config import EngineConfig
from engine.scheduling.request import Request, RequestError, SamplingParams
from engine.scheduling.scheduler import Scheduler


def scored(rid: str, prompt: list[int], max_tokens: int = 0) -> Request:
    return Request(prompt, SamplingParams(max_tokens=max_tokens, prompt_logprobs=0), id=rid)


def test_prefill_only_finishes_after_its_last_chunk() -> None:
    sched = Scheduler(EngineConfig(max_running=2, max_prefill_tokens=4, kv_tokens=64,
                                   page_size=4, prefix_cache=False))
    req = scored("A", list(range(10)))
    sched.add(req)
    rounds = []
    while sched.has_work:
        batch, finished = step(sched)
        assert batch is not None
        assert not any(item.sample for item in batch.items)  # nothing is ever sampled
        rounds.append(([it.num_tokens for it in batch.items], [r.id for r in finished]))
    assert rounds == [([4], []), ([4], []), ([2], ["A"])]
    assert req.finish_reason == "length" and req.num_outputs == 0 and req.slot is None
    assert sched.kv.free == sched.kv.total and sched.slots.num_free == 2


def test_scored_prompts_skip_the_prefix_cache() -> None:
    sched = Scheduler(EngineConfig(max_running=2, max_prefill_tokens=64, kv_tokens=64,
                                   page_size=4, prefix_cache=True))
    prompt = list(range(12))
    sched.add(make("plain", prompt, 1))
    while sched.has_work:
        step(sched)
    hit = make("hit", prompt, 1)
    sched.add(hit)
    step(sched)
    assert hit.num_cached == 8  # the cache holds the prompt ...
    while sched.has_work:
        step(sched)
    miss = scored("scored", prompt, 2)
    sched.add(miss)
    batch, _ = step(sched)
    assert miss.num_cached == 0 and batch is not None and batch.items[0].num_tokens == 12
    while sched.has_work:
        step(sched)
    assert miss.finish_reason == "length" and miss.num_outputs == 2


def test_max_tokens_zero_needs_a_scored_prompt() -> None:
    with pytest.raises(RequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(RequestError, match="seed"):
        SamplingParams(seed=2 ** 64)
    with pytest.raises(RequestError, match="logprobs"):
        SamplingParams(logprobs=21)
    SamplingParams(max_tokens=0, prompt_logprobs=0)

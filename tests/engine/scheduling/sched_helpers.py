"""Helpers the scheduling tests share: requests, one round against a fake executor, the
simulator on inline scenarios. No torch."""
from __future__ import annotations

from engine.scheduling.batch import Batch
from engine.scheduling.request import Request, SamplingParams
from engine.scheduling.scheduler import Scheduler
from engine.sim.scenario import parse
from engine.sim.simulator import simulate


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


SYSTEM = list(range(100, 116))  # 16 ids: four pages of 4


def prefix_scenario(second: list[int]) -> dict:
    """A (16-token prompt) still decodes when B arrives; pool of 48 positions, pages of 4."""
    return sim({"max_running": 4, "max_prefill_tokens": 64, "kv_tokens": 48, "page_size": 4,
                "prefix_cache": True},
               [{"id": "A", "prompt_ids": SYSTEM, "output": 8},
                {"id": "B", "arrive": 0.5, "prompt_ids": second, "output": 4}])

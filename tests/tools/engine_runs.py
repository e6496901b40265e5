"""Greedy runs through a started Engine, and the check that it gave everything back
(test_engine_greedy, test_gguf)."""
from __future__ import annotations

from engine.runtime.engine import Engine
from engine.runtime.handle import TextDelta
from engine.scheduling.request import SamplingParams

STEPS = 6


def run_all(engine: Engine, prompts: list[list[int]], cached: list[int] | None = None
            ) -> list[list[int]]:
    """Submit all prompts at once, STEPS tokens each; return their tokens (and append their
    cached prompt tokens to `cached`)."""
    params = SamplingParams(max_tokens=STEPS, ignore_eos=True)
    handles = [engine.submit(p, params) for p in prompts]
    outs = []
    for h in handles:
        toks: list[int] = []
        for ev in h.events(timeout=60):
            if isinstance(ev, TextDelta):
                toks.extend(ev.token_ids)
            else:
                assert ev.finish_reason == "length", ev
                assert ev.usage.completion_tokens == STEPS
                if cached is not None:
                    cached.append(ev.usage.cached_tokens)
        outs.append(toks)
    return outs


def assert_all_free(engine: Engine) -> None:
    assert engine.wait_idle(30)
    snap = engine.snapshot()
    assert snap.free_slots == snap.max_running
    assert snap.kv.used == 0 and snap.kv.reserved == 0
    assert snap.kv.free + snap.kv.cached == snap.kv.total

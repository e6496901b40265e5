"""Fairness between users with the real engine and the default model, read from the
engine snapshot's rounds (what the dashboard's timeline shows).

User b is decoding when user a submits a prompt much longer than the prefill budget, so
it is chunked over several rounds. Under `interleave` b never waits more than one prefill
chunk between two of its decode rounds (no two non-decode rounds in a row while b runs);
under `mixed` every round of a's chunks carries b's decode too. Under `prefill-first`
(the default policy, for contrast) b waits through a's chunks back to back.
`ferry bench --stall` measures the same thing in milliseconds.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.runtime.engine import Engine
from engine.runtime.handle import TextDelta
from engine.runtime.snapshot import RoundView
from engine.scheduling.request import SamplingParams

pytestmark = pytest.mark.model
BUDGET = 64
LONG_PROMPT = 400  # about seven chunks of BUDGET


def run_rounds(policy: str, weights: Any, model_dir: Path) -> tuple[list[RoundView], str, str]:
    from engine.execution.executor import ModelExecutor
    from engine.execution.text.tokenizer import read_eos_ids
    config = EngineConfig(max_running=4, max_prefill_tokens=BUDGET, kv_tokens=4096,
                          page_size=16, max_context=2048, policy=policy,  # type: ignore[arg-type]
                          admission="fair", prefix_cache=False, rounds_kept=1000)
    executor = ModelExecutor(weights, config, "cpu", None, read_eos_ids(model_dir), model_dir)
    engine = Engine(config, executor).start()
    rng = random.Random(7)
    try:
        b = engine.submit([rng.randrange(100, 40000) for _ in range(20)],
                          SamplingParams(max_tokens=48, ignore_eos=True), owner="b")
        events = b.events(timeout=60)
        tokens = 0
        while tokens < 2:  # b is decoding before a arrives
            event = next(events)
            tokens += isinstance(event, TextDelta)
        a = engine.submit([rng.randrange(100, 40000) for _ in range(LONG_PROMPT)],
                          SamplingParams(max_tokens=1, ignore_eos=True), owner="a")
        assert a.final is None
        list(a.events(timeout=120))
        list(events)
        assert engine.wait_idle(30)
        rounds = list(engine.snapshot().rounds)
    finally:
        engine.stop()
    return rounds, a.id, b.id


def window(rounds: list[RoundView], a: str, b: str) -> list[RoundView]:
    """The rounds from a's first chunk to its last; b must be running throughout."""
    assert [r.index for r in rounds] == list(range(rounds[0].index, rounds[-1].index + 1))
    with_a = [i for i, r in enumerate(rounds) if a in dict(r.batch)]
    first, last = with_a[0], with_a[-1]
    assert len(with_a) >= LONG_PROMPT // BUDGET, "a's prompt was not chunked"
    b_finish = next(i for i, r in enumerate(rounds) if b in r.finished)
    b_first_decode = next(i for i, r in enumerate(rounds) if b in r.decodes)
    assert b_first_decode < first and b_finish > last, "b was not running through a's prefill"
    return rounds[first:last + 1]


@pytest.fixture(scope="module")
def engine_rounds(weights: Any, model_dir: Path) -> dict[str, tuple[list[RoundView], str, str]]:
    return {policy: run_rounds(policy, weights, model_dir)
            for policy in ("interleave", "mixed", "prefill-first")}


def test_interleave_never_two_prefill_rounds_in_a_row(engine_rounds: dict[str, Any]) -> None:
    rounds, a, b = engine_rounds["interleave"]
    span = window(rounds, a, b)
    decoded = [b in r.decodes for r in span]
    for i in range(1, len(span)):
        assert decoded[i - 1] or decoded[i], (
            f"b waited through rounds {span[i - 1].index} and {span[i].index}: "
            f"{[(r.index, r.phase, r.batch) for r in span]}")
    for r in span:  # every round is either a chunk of a, or a decode round including b
        assert (r.phase == "prefill" and a in dict(r.batch)) or (
            r.phase == "decode" and b in r.decodes), r
    gaps = [j - i for i, j in zip([i for i, d in enumerate(decoded) if d],
                                  [i for i, d in enumerate(decoded) if d][1:])]
    assert max(gaps) <= 2, gaps  # at most one prefill chunk between two of b's decodes


def test_mixed_decodes_b_in_every_round(engine_rounds: dict[str, Any]) -> None:
    rounds, a, b = engine_rounds["mixed"]
    span = window(rounds, a, b)
    for r in span:
        assert b in r.decodes, f"round {r.index} ({r.phase}) left b out: {r.batch}"
        assert r.phase == "mixed" and dict(r.batch)[a] <= BUDGET - 1, r


def test_prefill_first_stalls_b_for_the_whole_prompt(engine_rounds: dict[str, Any]) -> None:
    rounds, a, b = engine_rounds["prefill-first"]
    span = window(rounds, a, b)
    assert all(b not in r.decodes for r in span)  # the contrast the other two policies fix
    assert len(span) >= LONG_PROMPT // BUDGET

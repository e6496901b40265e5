"""Property tests over random scenarios, for every policy (docs/architecture.md, Scheduling).

Each example runs the real scheduler through engine.sim.simulator.Simulation, with hooks that
check the accounting after every round and compare each phase choice against an oracle that
recomputes admission of the queue head from the raw state (slots, pages, cache tree).
"""
from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from engine.config import POLICIES, EngineConfig
from engine.scheduling.batch import Batch
from engine.scheduling.request import RequestState
from engine.scheduling.scheduler import Scheduler
from engine.sim.scenario import Scenario, parse
from engine.sim.simulator import Simulation

MAX_ROUNDS = 5000  # far above what these scenarios need; a guard against livelock
REASONS = {"length", "stop", "cancelled", "error"}
SYSTEM_PROMPTS = [[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5],
                  list(range(10, 26))]

half_steps = st.integers(0, 60).map(lambda x: x / 2)


@st.composite
def prompt_fields(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"prompt": draw(st.integers(1, 40))}
    ids = draw(st.sampled_from(SYSTEM_PROMPTS)) + draw(st.lists(st.integers(0, 3), max_size=12))
    return {"prompt_ids": ids or [0]}


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    page_size = draw(st.integers(1, 8))
    engine = {
        "max_running": draw(st.integers(1, 8)),
        "max_prefill_tokens": draw(st.integers(1, 64)),
        "page_size": page_size,
        "kv_tokens": draw(st.integers(max(page_size, 8), 256)),
        "prefix_cache": draw(st.booleans()),
        "admission": draw(st.sampled_from(["fifo", "fair"])),
        "max_context": draw(st.sampled_from([8192, 8192, 48])),
    }
    requests = []
    for i in range(draw(st.integers(1, 25))):
        req: dict[str, Any] = {"id": f"r{i}", "arrive": draw(half_steps), **draw(prompt_fields()),
                               "output": draw(st.integers(1, 20)),
                               "user": draw(st.sampled_from("abc"))}
        if draw(st.integers(0, 3)) == 0:
            req["eos_at"] = draw(st.integers(1, 22))
        if draw(st.integers(0, 4)) == 0:
            req["ignore_eos"] = True
        if draw(st.integers(0, 4)) == 0:
            req["cancel_at"] = draw(half_steps)
        requests.append(req)
    return {"engine": engine, "requests": requests}


# -- an independent admission oracle for the queue head ----------------------------------------
def _tree_nodes(sched: Scheduler) -> list[Any]:
    cache = sched.kv.cache
    if cache is None:
        return []
    out, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def head_can_prefill(sched: Scheduler, budget: int) -> bool:
    """Would the head of the waiting queue get prefill work this round? Recomputed from the
    slot table, the free list and the cache tree, not from Admission."""
    if budget <= 0:
        return False
    order = sched.ordered_waiting()
    if not order:
        return False
    head = order[0]
    if head.state is RequestState.CHUNKED:
        return True
    if sched.slots.num_free == 0:
        return False
    ps = sched.config.page_size
    path = []
    if sched.kv.cache is not None:
        node = sched.kv.cache.root
        for i in range((head.prompt_len - 1) // ps):
            node = node.children.get(tuple(head.prompt_ids[i * ps:(i + 1) * ps]))
            if node is None:
                break
            path.append(node)
    unlocked = sum(1 for n in _tree_nodes(sched) if n.lock_ref == 0)
    lost = sum(1 for n in path if n.lock_ref == 0)
    available = (sched.kv.allocator.num_free + unlocked - lost) * ps
    reserved = sum(max(0, r.prompt_len - r.num_computed) + r.params.max_tokens - r.num_outputs
                   + ps - 1 for r in sched.running + sched.chunked)
    need = head.prompt_len - len(path) * ps + head.params.max_tokens + ps - 1
    return need + reserved <= available


def assert_decode_space(sched: Scheduler) -> None:
    """Admission guarantees decode space. Every admitted request may still need
    pages up to position prompt + max_tokens - 2 (the last sampled token is never written);
    those pages must all be obtainable from the free list and the evictable cache."""
    ps = sched.config.page_size
    kv = sched.kv
    pages = sum(max(0, -(-(r.prompt_len + r.params.max_tokens - 1) // ps) - len(r.pages))
                for r in sched.running + sched.chunked)
    assert pages * ps <= kv.free + kv.evictable, (
        f"admitted requests may need {pages} more pages, only "
        f"{(kv.free + kv.evictable) // ps} free or evictable")


class Checked(Simulation):
    """A Simulation whose scheduler is checked around every select and after every round."""

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario, detail=True)
        sched = self.core.scheduler
        self.decisions: list[dict[str, Any]] = []
        select, step = sched.select, self.core.step

        def checked_select(now: float) -> Batch | None:
            cfg = sched.config
            running = [r.id for r in sorted(sched.running, key=lambda r: r.arrival)]
            decode_turn = (cfg.policy == "interleave" and sched.last_phase == "prefill"
                           and bool(running))
            budget = cfg.max_prefill_tokens - (len(running) if cfg.policy == "mixed" else 0)
            could = not decode_turn and head_can_prefill(sched, budget)
            batch = select(now)
            self.decisions.append({"running": running, "could": could, "turn": decode_turn,
                                   "batch": batch})
            return batch

        def checked_step() -> Any:
            record = step()
            sched.check_accounting()
            assert sched.kv.held <= sched.kv.total
            assert_decode_space(sched)
            assert len(self.rounds) < MAX_ROUNDS, "the simulation does not end"
            return record

        process = sched.process

        def checked_process(batch: Batch, tokens: list[int | None], now: float) -> Any:
            # Processing results only hands KV back (finishes) or moves a finished prompt into
            # the cache under the request's own lock: what admission counted as free or
            # evictable must not shrink here, or a reservation loses its pages.
            before = sched.kv.free + sched.kv.evictable
            finished = process(batch, tokens, now)
            assert sched.kv.free + sched.kv.evictable >= before, "process() took KV space"
            return finished

        sched.select = checked_select  # type: ignore[method-assign]
        sched.process = checked_process  # type: ignore[method-assign]
        self.core.step = checked_step  # type: ignore[method-assign]


def run_checked(data: dict[str, Any], policy: str) -> tuple[dict[str, Any], Checked]:
    sim = Checked(parse(data, policy))
    return sim.run(), sim  # must not raise (OutOfPages would mean a decode lacked KV)


def check_decisions(sim: Checked, policy: str, max_prefill: int) -> None:
    for d in sim.decisions:
        batch, running = d["batch"], d["running"]
        if batch is None:
            assert not d["could"] and not running, d
            continue
        decodes = [it.request.id for it in batch.items if it.is_decode]
        prefills = [it for it in batch.items if not it.is_decode]
        if policy == "mixed":
            assert decodes == running, "a mixed round decodes every running request"
            assert bool(prefills) == d["could"], d
            continue
        if batch.phase == "decode":
            # Never a decode round while a prefill batch could be formed (prefill-first rule);
            # under interleave, the decode turn right after a prefill round.
            assert not d["could"], f"{policy}: decode round although the head fits: {d}"
            assert decodes == running, "a decode round takes every running request"
        else:
            assert batch.phase == "prefill" and not decodes
            assert d["could"] and not d["turn"], d
            assert sum(it.num_tokens for it in batch.items) <= max_prefill


def check_rounds(result: dict[str, Any], scenario: dict[str, Any], cfg: EngineConfig) -> None:
    policy = cfg.policy
    total = cfg.num_pages * cfg.page_size
    max_tokens = {r["id"]: r["output"] for r in scenario["requests"]}
    done: set[str] = set()
    prev_outputs = {rid: 0 for rid in max_tokens}
    for i, r in enumerate(result["rounds"]):
        batch = r["batch"]
        bids = [b["id"] for b in batch]
        assert len(bids) == len(set(bids)) and bids, r
        assert not set(bids) & done, f"a finished request ran again in round {r['round']}"
        tokens = sum(b["tokens"] for b in batch)
        if r["phase"] == "decode":
            assert all(b["tokens"] == 1 for b in batch)
        elif r["phase"] == "prefill":
            assert tokens <= cfg.max_prefill_tokens, r
        else:
            assert policy == "mixed"
            n_dec = sum(1 for b in batch if b["tokens"] == 1 and b["id"] in
                        result["rounds"][i - 1]["running"]) if i else 0
            prefill_tokens = tokens - n_dec
            assert prefill_tokens <= max(0, cfg.max_prefill_tokens - n_dec), r
            assert tokens <= cfg.max_prefill_tokens, r
        # slots: running + mid-chunk + free == max_running
        chunking = [w for w in r["waiting"] if r["waiting_reasons"][w]["code"] == "chunk"]
        assert r["free_slots"] >= 0
        assert len(r["running"]) + len(chunking) + r["free_slots"] == cfg.max_running, r
        assert 0 <= r["kv_used"] <= total and r["kv_used"] % cfg.page_size == 0
        assert set(r["waiting_reasons"]) == set(r["waiting"])
        for rid, n in r["outputs"].items():
            assert prev_outputs[rid] <= n <= max_tokens[rid]
        prev_outputs = r["outputs"]
        done |= set(r["finished"])
    if policy == "interleave":
        rounds = result["rounds"]
        for a, b in itertools.pairwise(rounds):
            if a["phase"] == "prefill" and b["phase"] == "prefill":
                # Every request that could decode after a was cancelled at b's boundary.
                skipped = set(a["running"])
                assert skipped <= set(b["finished"]) - {x["id"] for x in b["batch"]}, (a, b)
                assert all(result["requests"][s]["finish_reason"] == "cancelled" for s in skipped)


def check_requests(result: dict[str, Any], scenario: dict[str, Any], cfg: EngineConfig) -> None:
    ps = cfg.page_size
    total = cfg.num_pages * ps
    for spec in scenario["requests"]:
        got = result["requests"][spec["id"]]
        prompt = spec.get("prompt") or len(spec["prompt_ids"])
        reason, n = got["finish_reason"], got["output_tokens"]
        assert reason in REASONS, (spec, got)
        assert 0 <= n <= spec["output"]
        impossible = (prompt + spec["output"] > cfg.max_context
                      or prompt + spec["output"] + ps - 1 > total)
        assert (reason == "error") == impossible, (spec, got)
        cancel = None if spec.get("cancel_at") is None else \
            math.ceil(max(spec["cancel_at"], spec["arrive"]))
        if reason == "error":
            assert n == 0 and got["finish_round"] == math.ceil(spec["arrive"])
            continue
        if reason == "cancelled":
            assert got["finish_round"] == cancel, (spec, got)
            continue
        if cancel is not None:
            assert got["finish_round"] < cancel, (spec, got)
        eos = spec.get("eos_at")
        if eos is not None and not spec.get("ignore_eos") and eos <= spec["output"]:
            assert (reason, n) == ("stop", eos), (spec, got)
        else:
            assert (reason, n) == ("length", spec["output"]), (spec, got)
        assert got["first_token_round"] is not None
        assert math.ceil(spec["arrive"]) <= got["first_token_round"] <= got["finish_round"]


def check_final_state(sim: Checked) -> None:
    sched = sim.core.scheduler
    sched.check_accounting()
    assert not sched.live and not sched.waiting and not sched.running and not sched.chunked
    assert sched.slots.num_free == sched.config.max_running
    assert sched.kv.held == 0
    assert sched.kv.free + sched.kv.evictable == sched.kv.total
    assert sched.reservations() == 0


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=scenarios())
def test_random_scenarios(policy: str, data: dict[str, Any]) -> None:
    note(json.dumps({**data, "engine": {**data["engine"], "policy": policy}}))
    result, sim = run_checked(data, policy)
    check_decisions(sim, policy, data["engine"]["max_prefill_tokens"])
    check_rounds(result, data, sim.scenario.engine)
    check_requests(result, data, sim.scenario.engine)
    check_final_state(sim)


@pytest.mark.parametrize("policy", POLICIES)
def test_shared_system_prompt_under_pressure(policy: str) -> None:
    """A hand-made stress case: many requests share a system prompt in a tight pool."""
    system = list(range(100, 132))
    data = {"engine": {"max_running": 6, "max_prefill_tokens": 24, "page_size": 4,
                       "kv_tokens": 160, "prefix_cache": True},
            "requests": [{"id": f"q{i}", "arrive": i / 3, "prompt_ids": system + [i % 5] * (i % 7),
                          "output": 1 + (i * 7) % 13, "cancel_at": 9 if i % 11 == 3 else None}
                         for i in range(40)]}
    for req in data["requests"]:
        if req["cancel_at"] is None:
            del req["cancel_at"]
    result, sim = run_checked(data, policy)
    check_decisions(sim, policy, 24)
    check_rounds(result, data, sim.scenario.engine)
    check_requests(result, data, sim.scenario.engine)
    check_final_state(sim)

"""Speculative rounds through the real scheduler, KV accounting and prefix cache, torch-free.

The "model" is a deterministic rule over the sequence (the next token is the one three places
back, with a twist), and the executor verifies drafts against it exactly as greedy
verification does: kept while they equal the rule's token, then the rule's token. So plain
and speculative decoding must write the same tokens; the accounting is checked every round
(`free + cached + held == total`, slots, and pages that cover exactly what was computed).
"""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.config import EngineConfig
from engine.runtime.core import EngineCore
from engine.scheduling.batch import Batch, Sampled
from engine.scheduling.request import Request, RequestState, SamplingParams
from engine.speculative import DraftPolicy, Speculator

EOS = 999


def rule(seq: Sequence[int]) -> int:
    """Repeats the period-3 pattern, except every 11th position (a draft miss), and ends
    with EOS at position `eos` where the test sets one."""
    n = len(seq)
    if n % 11 == 0:
        return 100 + n % 7
    return seq[n - 3]


class RuleExecutor:
    """Greedy verification against `rule`; `eos_at`: sequence length at which it says EOS."""

    def __init__(self, eos_at: dict[str, int] | None = None) -> None:
        self.eos_at = eos_at or {}
        self.rounds: list[Batch] = []

    def next(self, req: Request, seq: list[int]) -> int:
        return EOS if self.eos_at.get(req.id) == len(seq) else rule(seq)

    def run(self, batch: Batch) -> list[Sampled]:
        self.rounds.append(batch)
        out: list[Sampled] = []
        for it in batch.items:
            req = it.request
            if not it.sample:
                out.append(None)
                continue
            seq = [req.token_at(p) for p in range(it.start + it.num_tokens - len(it.drafts))]
            run = []
            for d in it.drafts:
                want = self.next(req, seq + run)
                if d != want:
                    break
                run.append(d)
            run.append(self.next(req, seq + run))
            out.append(tuple(run) if it.drafts else run[0])
        return out

    def release(self, request: Request) -> None:
        pass


def drive(config: EngineConfig, prompts: dict[str, tuple[list[int], int]],
          eos_at: dict[str, int] | None = None) -> tuple[dict[str, Request], EngineCore]:
    ex = RuleExecutor(eos_at)
    core = EngineCore(config, ex, clock=lambda: 0.0)
    reqs = {}
    for rid, (prompt, max_tokens) in prompts.items():
        reqs[rid] = Request(prompt, SamplingParams(max_tokens=max_tokens), id=rid,
                            eos_ids=frozenset({EOS}))
        core.submit(reqs[rid])
    sched = core.scheduler
    ps = config.page_size
    while sched.has_work:
        batch = sched.select(0.0)
        assert batch is not None
        for it in batch.items:  # drafts stay inside the reservation
            req = it.request
            assert it.start + it.num_tokens <= req.prompt_len + req.params.max_tokens - 1
            assert len(req.pages) * ps <= req.prompt_len + req.params.max_tokens - 1 + ps - 1
        tokens = ex.run(batch)
        sched.process(batch, tokens, 0.0)
        for req in sched.running:  # rejected drafts' pages came back
            assert len(req.pages) == -(-req.num_computed // ps)
            assert req.num_computed == req.num_tokens - 1
        sched.check_accounting()
    sched.check_accounting()
    assert sched.kv.held == 0 and sched.slots.num_free == config.max_running
    return reqs, core


PROMPTS = {
    "a": ([1, 2, 3, 1, 2, 3, 1, 2], 40),
    "b": ([7, 8, 9, 4, 7, 8, 9, 4, 7], 33),
    "c": ([5, 6, 5, 6, 5], 2),  # one draft at most: max_tokens - outputs - 1
}


@pytest.mark.parametrize("policy", ["prefill-first", "interleave", "mixed"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_speculative_tokens_equal_plain_and_accounting_holds(page_size: int,
                                                             policy: str) -> None:
    base = {"max_running": 4, "kv_tokens": 512, "page_size": page_size, "policy": policy,
            "max_prefill_tokens": 8}  # prompts in chunks: prefills share rounds with drafts
    plain, _ = drive(EngineConfig(**base, speculative="off"), PROMPTS)
    spec, core = drive(EngineConfig(**base), PROMPTS)
    for rid in PROMPTS:
        assert spec[rid].output_ids == plain[rid].output_ids
        assert spec[rid].finish_reason == plain[rid].finish_reason == "length"
        assert spec[rid].num_outputs == PROMPTS[rid][1]
    totals = core.drafter.totals  # type: ignore[union-attr]
    assert totals.accepted > 20 and totals.drafted > totals.accepted  # kept and missed
    ex = core.executor
    assert isinstance(ex, RuleExecutor)
    assert len(ex.rounds) < 40  # fewer rounds than tokens: several per round


def test_eos_inside_an_accepted_run_ends_there() -> None:
    """The rule says EOS at sequence length 20 for "a": in the middle of a run of kept
    drafts, the request stops there with reason stop, and nothing after it is appended."""
    base = {"max_running": 4, "kv_tokens": 512, "page_size": 4}
    eos = {"a": 20}
    plain, _ = drive(EngineConfig(**base, speculative="off"), PROMPTS, eos)
    spec, core = drive(EngineConfig(**base), PROMPTS, eos)
    a = spec["a"]
    assert a.output_ids == plain["a"].output_ids and a.output_ids[-1] == EOS
    assert a.finish_reason == "stop" and a.num_tokens == 21
    ex = core.executor
    assert isinstance(ex, RuleExecutor)
    last = next(it for b in reversed(ex.rounds) for it in b.items if it.request is a)
    assert len(last.drafts) > 1 and last.start + 1 < 20  # EOS fell inside that run


def test_max_tokens_caps_drafts_and_the_run() -> None:
    """Drafts never go past max_tokens - outputs - 1, so a run never passes max_tokens."""
    base = {"max_running": 4, "kv_tokens": 512, "page_size": 4, "max_draft": 8}
    spec, core = drive(EngineConfig(**base), {"a": ([1, 2, 3] * 6, 6)})
    ex = core.executor
    assert isinstance(ex, RuleExecutor)
    for batch in ex.rounds:
        for it in batch.items:
            if it.drafts:
                assert len(it.drafts) <= it.request.params.max_tokens - \
                    (it.start + 1 - it.request.prompt_len) - 1
    assert spec["a"].num_outputs == 6 and spec["a"].finish_reason == "length"


def test_large_batches_and_opted_out_requests_do_not_draft() -> None:
    cfg = EngineConfig(max_running=8, kv_tokens=1024, page_size=4, speculative_batch=2)
    ex = RuleExecutor()
    core = EngineCore(cfg, ex, clock=lambda: 0.0)
    for i in range(3):
        core.submit(Request([1, 2, 3] * 4, SamplingParams(max_tokens=10), id=f"r{i}"))
    core.submit(Request([1, 2, 3] * 4, SamplingParams(max_tokens=30, speculative=False),
                        id="no"))
    while core.scheduler.has_work:
        record = core.step()
        assert record is not None
        running = sum(1 for it in record.batch.items if it.is_decode)
        for it in record.batch.items:
            if it.drafts:
                assert running <= 2 and it.request.id != "no"
        core.scheduler.check_accounting()


def test_drafts_stay_within_the_executors_decode_rows() -> None:
    cfg = EngineConfig(max_running=4, kv_tokens=1024, page_size=4)
    ex = RuleExecutor()
    ex.decode_rows = 5  # type: ignore[attr-defined]
    core = EngineCore(cfg, ex, clock=lambda: 0.0)
    for i in range(2):
        core.submit(Request([1, 2, 3] * 4, SamplingParams(max_tokens=20), id=f"r{i}"))
    seen = False
    while core.scheduler.has_work:
        record = core.step()
        assert record is not None
        if all(it.is_decode for it in record.batch.items):
            assert record.batch.num_tokens <= 5
            seen = seen or any(it.drafts for it in record.batch.items)
    assert seen


def test_a_failed_speculative_round_returns_every_page() -> None:
    cfg = EngineConfig(max_running=4, kv_tokens=256, page_size=4)
    core = EngineCore(cfg, RuleExecutor(), clock=lambda: 0.0)
    req = Request([1, 2, 3] * 4, SamplingParams(max_tokens=30), id="a")
    core.submit(req)
    while True:  # until a round drafts
        batch = core.scheduler.select(0.0)
        assert batch is not None
        if batch.items[0].drafts:
            break
        core.scheduler.process(batch, core.executor.run(batch), 0.0)
    assert len(req.pages) * 4 >= batch.items[0].start + batch.items[0].num_tokens
    core.scheduler.fail(batch, "injected", 0.0)
    assert req.state is RequestState.FINISHED and req.finish_reason == "error"
    core.scheduler.check_accounting()
    kv = core.scheduler.kv
    assert kv.held == 0 and kv.free + kv.evictable == 256  # a failed round caches nothing
    assert kv.evictable == 12  # but the prompt's pages entered the cache when it was done


def test_a_request_whose_drafts_keep_failing_stops_drafting() -> None:
    """Drafts that are always wrong: after `patience` misses the request decodes plainly."""
    policy = DraftPolicy(max_len=4, patience=3, cooldown=100)
    spec = Speculator(policy, source=lambda req, k: [12345] * k)
    cfg = EngineConfig(max_running=2, kv_tokens=512, page_size=4)
    core = EngineCore(cfg, RuleExecutor(), clock=lambda: 0.0, drafter=spec)
    core.submit(Request([1, 2, 3] * 4, SamplingParams(max_tokens=30), id="a"))
    drafted_rounds = 0
    while core.scheduler.has_work:
        record = core.step()
        assert record is not None
        drafted_rounds += any(it.drafts for it in record.batch.items)
    assert drafted_rounds == 3 and spec.totals.accepted == 0

"""Draft-model rounds through the real scheduler and core, torch-free: the drafter asks the
draft model once per round for every drafting request (`prepare`), within the round's rows;
output is the rule's plain output; a finished or cancelled request's draft state goes.

The draft "model" follows the same rule as test_speculative_rounds' target but without its
twist, so it misses every 11th position; it counts the positions it would hold K/V for.
"""
from __future__ import annotations

from collections.abc import Sequence

from test_speculative_rounds import EOS, RuleExecutor, rule

from engine.config import EngineConfig
from engine.runtime.core import EngineCore
from engine.scheduling.request import Request, SamplingParams
from engine.speculative import Speculator


class RuleDraft:
    num_pages = 1000

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []
        self.held: dict[str, int] = {}  # request -> positions of draft K/V

    @property
    def free_pages(self) -> int:
        return self.num_pages - sum(self.held.values())

    def propose(self, asks: Sequence[tuple[Request, int]]) -> list[list[int]]:
        self.calls.append([(r.id, k) for r, k in asks])
        out = []
        for req, k in asks:
            seq = req.prompt_ids + req.output_ids
            drafts: list[int] = []
            for _ in range(k):
                drafts.append((seq + drafts)[len(seq + drafts) - 3])
            self.held[req.id] = len(seq) + k - 1
            out.append(drafts)
        return out

    def release(self, request: Request) -> None:
        self.held.pop(request.id, None)


def run(core: EngineCore, prompts: dict[str, list[int]], max_tokens: int,
        cancel_after: int | None = None) -> dict[str, Request]:
    reqs = {rid: Request(p, SamplingParams(max_tokens=max_tokens), id=rid,
                         eos_ids=frozenset({EOS})) for rid, p in prompts.items()}
    for r in reqs.values():
        core.submit(r)
    rounds = 0
    while core.step() is not None:
        rounds += 1
        if rounds == cancel_after:
            core.cancel("b")
    return reqs


def test_one_batched_proposal_per_round_and_plain_output() -> None:
    cfg = EngineConfig(max_running=4, kv_tokens=1024, page_size=4, speculative="draft")
    prompts = {"a": [1, 2, 3, 1, 2], "b": [7, 8, 9, 7], "c": [4, 5, 6, 4, 5, 6]}
    draft = RuleDraft()
    core = EngineCore(cfg, RuleExecutor(), clock=lambda: 0.0, draft_model=draft)
    assert isinstance(core.drafter, Speculator) and core.drafter.kind == "draft"
    reqs = run(core, prompts, 30)
    for rid, prompt in prompts.items():
        seq = list(prompt)
        for _ in range(30):
            seq.append(rule(seq))
        assert reqs[rid].output_ids == seq[len(prompt):]
    assert len(draft.calls) >= 5 and all(len(c) == 3 for c in draft.calls[:3])
    assert not draft.held  # every request released its draft state
    totals = core.drafter.totals
    assert 0 < totals.accepted < totals.drafted


def test_a_cancelled_request_releases_its_draft_state() -> None:
    cfg = EngineConfig(max_running=4, kv_tokens=1024, page_size=4, speculative="draft")
    draft = RuleDraft()
    core = EngineCore(cfg, RuleExecutor(), clock=lambda: 0.0, draft_model=draft)
    reqs = run(core, {"a": [1, 2, 3, 1], "b": [7, 8, 9, 7]}, 40, cancel_after=3)
    assert reqs["b"].finish_reason == "cancelled" and reqs["a"].num_outputs == 40
    assert not draft.held and draft.free_pages == draft.num_pages

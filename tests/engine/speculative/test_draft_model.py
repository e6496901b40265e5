"""Speculative decoding with a draft model, through the real engine and both models.

The target is the default model with two extra, slightly random layers (tests/tools/
deeper_gguf.py); the default model drafts for it. Greedy output with draft-model speculation
is token for token the target's plain greedy output, alone and several at once, with drafts
both kept and rejected. Sampled requests speculate too: greedy drafts are certain given the
sequence (q(d) = 1), the case the executor's rejection rule already verifies as for prompt
lookup (test_speculative_decoding's chi-square test). A cancel during a speculative round,
and every test's end, give back every slot and page of the target's pool and the draft's.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.execution.draft_runner import DraftRunner
from engine.execution.executor import ModelExecutor
from engine.execution.text.tokenizer import Tokenizer
from engine.runtime.engine import Engine
from engine.runtime.handle import TextDelta
from engine.scheduling.request import Request, SamplingParams
from engine.speculative import DraftModelError, Speculator, check_vocabularies
from tests.tools.gate import Gate

PROMPTS = ["Write a short story about a cat who learns to sail.",
           "What is the capital of France?",
           "List three fruits, one per line.",
           "Explain in two sentences why the sky is blue."]
OUTPUT = 40
CACHE = Path(tempfile.gettempdir()) / "ferry-test-model-cache"


@pytest.fixture(scope="module")
def target(deeper_gguf: Path) -> ModelExecutor:
    config = EngineConfig(kv_tokens=4096, max_context=2048, prefix_cache=False,
                          speculative="draft")
    return ModelExecutor.from_pretrained(deeper_gguf, config, threads=1, cache_dir=CACHE)


@pytest.fixture(scope="module")
def target_tokenizer(target: ModelExecutor) -> Tokenizer:
    assert target.tokenizer_path is not None
    return Tokenizer(target.tokenizer_path, CACHE)


@pytest.fixture(scope="module")
def draft(target: ModelExecutor, target_tokenizer: Tokenizer, model_dir: Path) -> DraftRunner:
    return DraftRunner.load(model_dir, target, target_tokenizer.hf.get_vocab(),
                            cache_dir=CACHE)


@pytest.fixture(scope="module")
def chat_ids(target_tokenizer: Tokenizer) -> list[list[int]]:
    return [target_tokenizer.apply_chat_template([{"role": "user", "content": text}])
            for text in PROMPTS]


def assert_all_back(engine: Engine, draft: DraftRunner) -> None:
    assert engine.wait_idle(30)
    snap = engine.snapshot()
    assert snap.free_slots == snap.max_running
    assert snap.kv.used == 0 and snap.kv.reserved == 0
    assert snap.kv.free + snap.kv.cached == snap.kv.total
    assert draft.free_pages == draft.num_pages and not draft.shadows


@pytest.fixture
def engine(target: ModelExecutor, draft: DraftRunner) -> Iterator[Engine]:
    eng = Engine(target.config, target, draft_model=draft).start()
    yield eng
    assert_all_back(eng, draft)
    eng.stop()


def tokens(engine: Engine, prompts: Sequence[list[int]], speculative: bool,
           **params: float) -> list[list[int]]:
    sampling = SamplingParams(max_tokens=OUTPUT, speculative=speculative, **params)
    handles = [engine.submit(p, sampling) for p in prompts]
    out = []
    for h in handles:
        toks: list[int] = []
        for ev in h.events(timeout=300):
            if isinstance(ev, TextDelta):
                toks.extend(ev.token_ids)
        out.append(toks)
    return out


def test_greedy_draft_model_output_is_plain_greedy_output(
        engine: Engine, chat_ids: list[list[int]]) -> None:
    plain = [tokens(engine, [p], speculative=False)[0] for p in chat_ids]
    before = engine.snapshot().metrics
    assert before.drafted_tokens == 0
    alone = [tokens(engine, [p], speculative=True)[0] for p in chat_ids]
    together = tokens(engine, chat_ids[:3], speculative=True)  # one batched draft pass
    assert alone == plain
    assert together == plain[:3]
    snap = engine.snapshot()
    assert snap.speculative == "draft"
    m = snap.metrics
    # the draft mostly agrees with the deeper target, but not always: both paths ran
    assert 0 < m.accepted_tokens < m.drafted_tokens
    assert m.acceptance > 0.5 and m.tokens_per_step > 1.2
    core = engine._core
    assert isinstance(core.drafter, Speculator) and core.drafter.kind == "draft"


def test_sampled_requests_speculate_with_the_draft_model(
        engine: Engine, chat_ids: list[list[int]]) -> None:
    out = tokens(engine, chat_ids[:2], speculative=True, temperature=0.7, top_p=0.95)
    assert all(0 < len(t) <= OUTPUT for t in out)
    m = engine.snapshot().metrics
    assert m.drafted_tokens > 0 and m.accepted_tokens > 0


def test_draft_kv_follows_the_accepted_prefix(target: ModelExecutor, draft: DraftRunner,
                                              chat_ids: list[list[int]]) -> None:
    """After a proposal the draft's K/V covers the sequence and the drafts it fed back;
    when the target keeps some drafts, the next proposal keeps the K/V of those only."""
    req = Request(list(chat_ids[1]), SamplingParams(), id="probe")
    n = req.num_tokens
    first = draft.propose([(req, 4)])[0]
    assert len(first) == 4
    shadow = draft.shadows["probe"]
    assert shadow.computed == n + 3  # the sequence and three of the four drafts
    assert len(shadow.pages) == -(-(n + 3) // draft.page_size)
    req.output_ids.extend([*first[:2], first[2] + 1])  # two kept, then another token
    second = draft.propose([(req, 2)])[0]
    assert len(second) == 2
    assert shadow.computed == n + 3 + 1  # its valid prefix (n + 2), recomputed to the end
    draft.release(req)
    assert draft.free_pages == draft.num_pages


def test_a_long_prompt_is_drafted_for_after_chunks(draft: DraftRunner,
                                                  chat_ids: list[list[int]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft builds a long prompt's K/V `chunk` positions a round (no drafts yet),
    then drafts as usual."""
    monkeypatch.setattr(draft, "chunk", 16)
    req = Request(list(chat_ids[0]), SamplingParams(), id="long")
    n = req.num_tokens
    rounds = 0
    while not (drafts := draft.propose([(req, 3)])[0]):
        rounds += 1
        assert draft.shadows["long"].computed == 16 * rounds
    assert rounds == (n - 1) // 16 and len(drafts) == 3
    assert draft.shadows["long"].computed == n + 2
    draft.release(req)
    assert draft.free_pages == draft.num_pages



def test_cancel_during_a_draft_round_returns_every_page(
        target: ModelExecutor, draft: DraftRunner, chat_ids: list[list[int]]) -> None:
    gate = Gate(target)
    eng = Engine(target.config, gate, draft_model=draft).start()
    try:
        other = eng.submit(chat_ids[1], SamplingParams(max_tokens=8))
        handle = eng.submit(chat_ids[0], SamplingParams(max_tokens=200, ignore_eos=True))
        assert gate.inside.wait(120), "no speculative round"
        assert eng._core.scheduler.kv.held > 0  # the round's drafts hold target pages
        assert draft.free_pages < draft.num_pages  # and the draft's K/V its own
        assert handle.cancel()
        gate.release_gate.set()
        final = list(handle.events(timeout=120))[-1]
        assert final.finish_reason == "cancelled"  # type: ignore[union-attr]
        list(other.events(timeout=120))
        assert_all_back(eng, draft)
    finally:
        gate.release_gate.set()
        eng.stop()


def test_a_draft_engine_without_a_draft_model_is_refused(target: ModelExecutor) -> None:
    with pytest.raises(DraftModelError, match="needs a draft model"):
        Engine(target.config, target)


def test_vocabularies_must_match() -> None:
    vocab = {"a": 0, "b": 1, "c": 2}
    check_vocabularies(vocab, dict(vocab))
    with pytest.raises(DraftModelError, match="has 2 tokens, the target's 3"):
        check_vocabularies(vocab, {"a": 0, "b": 1})
    with pytest.raises(DraftModelError, match=r"1 tokens differ, e\.g\. 'c'"):
        check_vocabularies(vocab, {"a": 0, "b": 1, "d": 2})

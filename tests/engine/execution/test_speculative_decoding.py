"""Speculative decoding through the real engine and model executor.

Greedy: the default model (its GGUF, as `ferry serve` runs it) writes the same tokens with
prompt-lookup drafts as without, alone and several at once, and drafts are really kept on
repetition-heavy prompts. Sampled: the executor's verification leaves the first and second
emitted token distributed as plain sampling's (chi-square on a tiny model). A cancel that
arrives while a speculative round runs gives back every page and slot.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.execution.sampling.verify import target_probs
from engine.execution.text.tokenizer import Tokenizer
from engine.runtime.engine import Engine
from engine.runtime.handle import TextDelta
from engine.scheduling.batch import Batch, BatchItem
from engine.scheduling.request import SamplingParams
from tests.tools.engine_runs import assert_all_free
from tests.tools.gate import Gate

PARAGRAPH = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk. He "
             "lit the great lamp, wound the clockwork that turned it, and wrote the weather "
             "in his logbook before he made his tea.")
CODE = "def area(width, height):\n    return width + height\n\nprint(area(3, 4))\n"
REPEATING = [  # the reply repeats much of the prompt
    f"Repeat this paragraph exactly, but change 'evening' to 'morning':\n\n{PARAGRAPH}",
    f"Fix the bug in this code and show the whole corrected code:\n\n{CODE}",
    "Put this list in alphabetical order, one per line:\npear\napple\nfig\nbanana\ncherry",
]
PLAIN = ["Write a short story about a cat who learns to sail.", "What is the capital of France?"]
OUTPUT = 64


@pytest.fixture(scope="module")
def gguf_executor(model_dir: Path) -> ModelExecutor:
    config = EngineConfig(kv_tokens=4096, max_context=2048, prefix_cache=False)
    return ModelExecutor.from_pretrained(model_dir, config, threads=1)


@pytest.fixture(scope="module")
def chat_ids(tokenizer: Tokenizer) -> dict[str, list[int]]:
    return {text: tokenizer.apply_chat_template([{"role": "user", "content": text}])
            for text in REPEATING + PLAIN}


@pytest.fixture
def engine(gguf_executor: ModelExecutor) -> Iterator[Engine]:
    # no prefix cache: a cached prefix changes the prefill's rows, hence its numbers
    eng = Engine(gguf_executor.config, gguf_executor).start()
    yield eng
    assert_all_free(eng)
    eng.stop()


def tokens(engine: Engine, prompts: Sequence[list[int]], speculative: bool) -> list[list[int]]:
    params = SamplingParams(max_tokens=OUTPUT, speculative=speculative)
    handles = [engine.submit(p, params) for p in prompts]
    out = []
    for h in handles:
        toks: list[int] = []
        for ev in h.events(timeout=300):
            if isinstance(ev, TextDelta):
                toks.extend(ev.token_ids)
        out.append(toks)
    return out


def test_greedy_speculative_output_is_plain_greedy_output(
        engine: Engine, chat_ids: dict[str, list[int]]) -> None:
    prompts = [chat_ids[t] for t in REPEATING + PLAIN]
    plain = [tokens(engine, [p], speculative=False)[0] for p in prompts]
    before = engine.snapshot().metrics
    assert before.drafted_tokens == 0
    alone = [tokens(engine, [p], speculative=True)[0] for p in prompts[:len(REPEATING)]]
    assert engine.wait_idle(30)
    after = engine.snapshot().metrics  # the repetition-heavy prompts' rounds only
    alone += [tokens(engine, [p], speculative=True)[0] for p in prompts[len(REPEATING):]]
    together = tokens(engine, prompts[:3], speculative=True)  # three speculate in one round
    assert alone == plain
    assert together == plain[:3]
    # drafts were made and kept: more than one token per decoding step on the prompts whose
    # replies repeat them
    assert after.accepted_tokens > 20
    steps = after.decode_steps - before.decode_steps
    assert (after.decode_tokens - before.decode_tokens) / steps > 1.2


def test_logprobs_of_speculative_tokens_are_plain_decodings(
        engine: Engine, chat_ids: dict[str, list[int]]) -> None:
    prompt = chat_ids[REPEATING[0]]
    got = {}
    for speculative in (False, True):
        params = SamplingParams(max_tokens=24, logprobs=2, speculative=speculative)
        handle = engine.submit(prompt, params)
        list(handle.events(timeout=300))
        got[speculative] = handle
    plain, spec = got[False], got[True]
    assert spec.token_ids == plain.token_ids and len(spec.logprobs) == 24
    for a, b in zip(plain.logprobs, spec.logprobs):
        assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)



def test_cancel_during_a_speculative_round_returns_every_page(
        gguf_executor: ModelExecutor, chat_ids: dict[str, list[int]]) -> None:
    gate = Gate(gguf_executor)
    eng = Engine(gguf_executor.config, gate).start()
    try:
        other = eng.submit(chat_ids[PLAIN[1]], SamplingParams(max_tokens=8))
        handle = eng.submit(chat_ids[REPEATING[0]],
                            SamplingParams(max_tokens=200, ignore_eos=True))
        assert gate.inside.wait(120), "no speculative round"
        pages = eng._core.scheduler.kv.held  # the round's drafts hold pages now
        assert handle.cancel()
        gate.release_gate.set()
        final = list(handle.events(timeout=120))[-1]
        assert final.finish_reason == "cancelled"  # type: ignore[union-attr]
        assert final.usage.completion_tokens < 200  # type: ignore[union-attr]
        list(other.events(timeout=120))
        assert pages > 0
        assert_all_free(eng)
    finally:
        gate.release_gate.set()
        eng.stop()


CHI2_DF4_P001 = 18.47  # chi-square critical value, 4 degrees of freedom, p = 0.001


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token the distribution excludes was emitted"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def test_sampled_verification_in_the_executor_keeps_the_distribution(
        tiny_models: dict[str, Any], make_harness: Any) -> None:
    """A speculative item (two drafts) run again and again on the same KV: the first emitted
    token follows plain sampling's distribution at that position and, when the first draft
    was kept, the second follows the distribution after it."""
    h = make_harness(tiny_models["llama"].path)
    params = SamplingParams(max_tokens=64, temperature=1.0, top_k=5, seed=3)
    req = h.new([5, 9, 17, 33, 5, 9, 17], temperature=1.0, top_k=5, seed=3)
    h.prefill([req])
    start = req.num_tokens - 1

    def plain_probs(seq_tail: list[int]) -> torch.Tensor:
        """The distribution plain sampling draws from after the sequence + seq_tail."""
        probe = h.new(req.prompt_ids + req.output_ids + seq_tail)
        h.prefill([probe])  # samples greedily; only its logits are used
        return target_probs(h.logits[probe.id][probe.prompt_len - 1][None], params)[0]

    p0 = plain_probs([])
    d0 = int(p0.argmax())
    p1 = plain_probs([d0])
    d1 = int(torch.where(p1 > 0, p1, 2.0).argmin())  # the least likely token left: rejected
    h.cover(req, start + 3)
    item = BatchItem(req, start, 3, True, (d0, d1))
    first, second = torch.zeros(p0.shape[0]), torch.zeros(p0.shape[0])
    for _ in range(2500):
        run = h.executor.run(Batch("decode", (item,)))[0]
        assert isinstance(run, tuple) and 1 <= len(run) <= 3
        first[run[0]] += 1
        if run[0] == d0 and len(run) >= 2:
            second[run[1]] += 1
    assert chi2(first, p0) < CHI2_DF4_P001
    assert second.sum() > 300
    assert chi2(second, p1) < CHI2_DF4_P001

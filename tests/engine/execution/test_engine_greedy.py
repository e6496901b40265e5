"""Greedy outputs through the whole engine (scheduler thread + model executor) equal HF's,
whatever the batch composition, chunking or prefix-cache hits; resources all come back."""
from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.runtime.engine import Engine
from tests.tools.engine_runs import STEPS, assert_all_free, run_all


def hf_greedy(tiny,  # conftest.TinyModel
               prompt: list[int], steps: int = STEPS) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(tiny.hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture
def engine_for(tiny_models):
    engines: list[Engine] = []

    def make(name: str, **cfg: object) -> Engine:
        config = EngineConfig(**{"max_running": 16, "kv_tokens": 4096, "page_size": 4, **cfg})
        ex = ModelExecutor.from_pretrained(tiny_models[name].path, config, dtype=torch.float32,
                                           threads=1)
        engines.append(Engine(config, ex).start())
        return engines[-1]

    yield make
    for e in engines:
        assert_all_free(e)
        e.stop()


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_engine_matches_hf_alone_batched_chunked_and_cached(engine_for, tiny_models,
                                                             name: str) -> None:
    tiny = tiny_models[name]
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(3, 30))] for _ in range(16)]
    expected = [hf_greedy(tiny, p) for p in prompts]

    alone = engine_for(name)
    assert [run_all(alone, [p])[0] for p in prompts[:4]] == expected[:4]
    assert_all_free(alone)

    assert run_all(engine_for(name), prompts) == expected  # one batch of 16, mixed lengths

    chunked = engine_for(name, max_prefill_tokens=5)  # every prompt spans several chunks
    assert run_all(chunked, prompts[:6]) == expected[:6]

    cached = engine_for(name, prefix_cache=True)
    shared = prompts[0][:3] + [rng.randrange(3, 300) for _ in range(20)]
    variants = [shared + [rng.randrange(3, 300) for _ in range(k + 1)] for k in range(4)]
    want = [hf_greedy(tiny, v) for v in variants]
    assert run_all(cached, variants[:1]) == want[:1]
    hits: list[int] = []
    assert run_all(cached, variants[1:], hits) == want[1:]
    assert all(h >= 20 for h in hits), hits  # the shared 23-token prefix: 5 whole pages
    hits.clear()
    assert run_all(cached, variants[:1], hits) == want[:1]  # the same prompt again
    assert hits[0] == (len(variants[0]) - 1) // 4 * 4  # all whole pages but the last token


@pytest.mark.parametrize("policy", ["interleave", "mixed"])
def test_policies_do_not_change_greedy_outputs(engine_for, tiny_models, policy: str) -> None:
    tiny = tiny_models["llama"]
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(3, 40))] for _ in range(8)]
    engine = engine_for("llama", policy=policy, max_prefill_tokens=16, max_running=4)
    assert run_all(engine, prompts) == [hf_greedy(tiny, p) for p in prompts]

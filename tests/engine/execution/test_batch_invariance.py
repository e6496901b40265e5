"""Batch invariance (`deterministic`): the default model's greedy reply to a long prompt, and
its log-probabilities, are the same bits computed whole, in chunks, mostly from the prefix
cache, or beside other requests. Without it they are not (docs/kernels.md, Reproducibility):
a 700-token prompt's long chunks attend in SDPA, short ones in the decode kernel, and on a CPU
with AMX many rows multiply in tiles, few in lanes."""
from __future__ import annotations

import ctypes
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, ModelExecutor, SamplingParams, TextDelta, Tokenizer
from engine.execution.loading.loader import resolve_model
from engine.kernels import native, quant
from engine.kernels.invariance import batch_invariant, set_batch_invariant
from tests.tools.engine_runs import assert_all_free

pytestmark = pytest.mark.model

WORDS = ("harbour", "lantern", "orchard", "ledger", "ferry", "granite", "meadow", "copper",
         "whistle", "saddle", "thunder", "velvet", "quarry", "pepper", "lattice", "marble")
STEPS = 6

Reply = list[tuple[int, float, tuple[tuple[int, float], ...]]]


@pytest.fixture
def invariant() -> Iterator[None]:
    if native.library() is None:
        pytest.skip(f"Ferry's kernels did not load: {native.status()}")
    assert set_batch_invariant(True) and batch_invariant()
    yield
    set_batch_invariant(False)


@pytest.fixture(scope="module")
def gguf() -> Path:
    return resolve_model(None)


def long_prompt(gguf: Path, tokens: int = 700) -> list[int]:
    rng = random.Random(11)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens * 2))
    ids = Tokenizer(gguf).encode(f"A list of words, then what they bring to mind: {words}")
    assert len(ids) >= tokens
    return ids[:tokens]


def replies(gguf: Path, prompts: list[list[int]], *, chunk: int = 2048, cache: bool = False,
            before: list[int] | None = None) -> list[Reply]:
    """Each prompt's greedy tokens with their top-2 log-probabilities, the prompts submitted
    at once (after `before` alone, when given), on an engine of their own."""
    cfg = EngineConfig(max_running=8, kv_tokens=8192, max_prefill_tokens=chunk,
                       prefix_cache=cache)
    engine = Engine(cfg, ModelExecutor.from_pretrained(str(gguf), cfg)).start()
    params = SamplingParams(max_tokens=STEPS, logprobs=2, ignore_eos=True)
    try:
        if before is not None:
            list(engine.submit(before, params).events(timeout=120))
        handles = [engine.submit(p, params) for p in prompts]
        out = []
        for h in handles:
            reply: Reply = []
            for ev in h.events(timeout=120):
                if isinstance(ev, TextDelta):
                    reply += [(lp.token_id, lp.logprob, lp.top) for lp in ev.logprobs or ()]
            assert len(reply) == STEPS
            out.append(reply)
        assert_all_free(engine)
    finally:
        engine.stop()
    return out


def test_a_long_prompt_gets_the_same_bits_however_it_is_computed(invariant: None,
                                                                  gguf: Path) -> None:
    prompt = long_prompt(gguf)
    (whole,) = replies(gguf, [prompt])
    # 48-row chunks: past 512 positions these attended in SDPA, the whole prompt's first 512
    # in the kernel; the cached run computes its last 300 rows in one chunk (AMX tiles)
    assert replies(gguf, [prompt], chunk=48) == [whole]
    assert replies(gguf, [prompt], cache=True, before=prompt[:400]) == [whole]
    others = [long_prompt(gguf, n)[::-1] for n in (9, 120, 333)]
    assert replies(gguf, [others[0], prompt, *others[1:]])[1] == whole


def test_the_kernels_keep_to_lanes_under_invariance(invariant: None) -> None:
    assert quant.many_rows() == quant.MANY_ROWS_LANES
    assert quant.many_rows(quant.Q4_K) == quant.MANY_ROWS_LANES
    lib = native.loaded()
    assert lib.ferry_qinvariant(-1) == 1
    w = quant.quantize(torch.randn(64, 256), quant.Q8_0)
    assert lib.ferry_qgemm_takes(ctypes.byref(quant._c(w)), 64) == 0  # no AMX from C either
    assert quant.native_rows(w) >= 1024
    set_batch_invariant(False)
    assert lib.ferry_qinvariant(-1) == 0
    assert bool(lib.ferry_qgemm_takes(ctypes.byref(quant._c(w)), 64)) == quant.uses_amx(w)


def test_a_mixture_of_experts_row_is_the_same_bits_beside_any_rows(invariant: None) -> None:
    # 80 rows: each expert gets many, which with AMX it would multiply in tiles (csrc/moe.c)
    from engine.execution.model.config import MoESpec
    from tests.engine.execution.model.test_moe_layer import HIDDEN, INTER, _quantized

    moe, _ = _quantized(MoESpec(8, 2, INTER))
    x = torch.randn(80, HIDDEN, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        together = moe(x)
        for t in (0, 5, 41, 79):
            assert torch.equal(moe(x[t:t + 1])[0], together[t])

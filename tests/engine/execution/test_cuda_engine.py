"""The executor on a real GPU (CUDA only): greedy output and logits against the CPU float32
reference on tiny models (float32 on the torch backend; bfloat16 on the backend chosen at
start-up, FlashInfer where it passes its self-test), one sampled speculative round, and one
grammar-masked round (a stand-in matcher that allows three ids)."""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest
import torch
from test_flashinfer_fake import assert_same_logits, lockstep

from engine.execution.sampling.verify import target_probs
from engine.scheduling.batch import Batch, BatchItem
from engine.scheduling.request import SamplingParams

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
PROMPTS = [[(5 * i + n) % 317 + 3 for i in range(n)] for n in (1, 5, 17, 40)]


@pytest.mark.parametrize("model", ["group1", "group4", "group8", "sliding", "moe"])
def test_float32_on_cuda_is_the_cpu_reference(wide_models: dict[str, Path], make_harness: Any,
                                              model: str) -> None:
    cpu = make_harness(wide_models[model])
    gpu = make_harness(wide_models[model], device="cuda")
    reqs = lockstep([cpu, gpu], PROMPTS)
    for lead, r in zip(*reqs):
        for pos, row in cpu.logits[lead.id].items():
            torch.testing.assert_close(gpu.logits[r.id][pos], row, atol=2e-3, rtol=2e-3)
            assert int(gpu.logits[r.id][pos].argmax()) == int(row.argmax())


@pytest.mark.parametrize("model", ["group4", "sliding", "moe"])
def test_bfloat16_on_cuda_follows_the_reference(wide_models: dict[str, Path],
                                                make_harness: Any, model: str) -> None:
    cpu = make_harness(wide_models[model])
    gpu = make_harness(wide_models[model], device="cuda", dtype=torch.bfloat16)
    print(f"{model}: attention {gpu.executor.attention}")
    assert_same_logits([cpu, gpu], lockstep([cpu, gpu], PROMPTS))


def test_a_sampled_speculative_round(wide_models: dict[str, Path], make_harness: Any) -> None:
    h = make_harness(wide_models["group4"], device="cuda", dtype=torch.bfloat16)
    req = h.new([5, 9, 17, 33, 5, 9, 17], temperature=0.7, top_k=5)
    h.prefill([req])
    start = req.num_tokens - 1
    h.cover(req, start + 3)
    probe = h.new(req.prompt_ids + req.output_ids)  # the distribution after the last token
    h.prefill([probe])
    probs = target_probs(h.logits[probe.id][probe.prompt_len - 1][None],
                         SamplingParams(temperature=0.7, top_k=5))[0]
    item = BatchItem(req, start, 3, True, (int(probs.argmax()), 11))
    for _ in range(50):
        run = h.executor.run(Batch("decode", (item,)))[0]
        assert isinstance(run, tuple) and 1 <= len(run) <= 3
        assert probs[run[0]] > 0  # within the top 5 plain sampling draws from


class AllowOnly:
    """A grammar matcher stand-in: the same few ids allowed at every step."""

    def __init__(self, ids: set[int], vocab: int) -> None:
        words = -(-vocab // 32)
        mask = [0] * words
        for i in ids:
            mask[i // 32] |= 1 << (i % 32)
        self.row = (ctypes.c_uint32 * words)(*mask)
        self.consumed: list[int] = []

    def unsafe_compute_mask_ptr(self, ptr: int, size: int) -> None:
        ctypes.memmove(ptr, self.row, size)

    def consume_token(self, token: int) -> None:
        self.consumed.append(token)

    def is_stopped(self) -> bool:
        return False

    def is_error(self) -> bool:
        return False


def test_a_grammar_masked_round(wide_models: dict[str, Path], make_harness: Any) -> None:
    h = make_harness(wide_models["group4"], device="cuda", dtype=torch.bfloat16)
    reqs = [h.new([3, 4, 5, 6]), h.new([7, 8, 9], temperature=0.7)]
    allowed = {7, 11, 300}
    for r in reqs:
        r.matcher = AllowOnly(allowed, h.executor.vocab_size)
    h.prefill(reqs)
    tokens = h.round([(r, r.num_tokens - 1, 1, True) for r in reqs], "decode", use_run=True)
    assert set(tokens) <= allowed
    assert [r.matcher.consumed for r in reqs] == [[t] for t in tokens]

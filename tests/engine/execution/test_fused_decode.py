"""The fused decode path (one C call per layer) against the layer-by-layer path, bit for bit.

Both run the same kernels in the same order, so every logit must be identical, for every
architecture (biases, tied embeddings, MQA/GQA, Qwen3's q/k norms); the fused path must be
taken exactly for decode-only rounds of up to NATIVE_DIRECT_ROWS bf16 sequences.
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.execution.model import linear_kernels
from engine.kernels import ops

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


# the fused path is for CPUs that emulate bf16: take it on any CPU here
pytestmark = pytest.mark.usefixtures("native_kernels", "emulated")


def _run(harness, fused: bool) -> list[dict[int, torch.Tensor]]:
    """Prefill 5 prompts (one round), decode 4 rounds of all 5, then a mixed round and 2 more
    decode rounds of 2; return the logits recorded per request and position."""
    model = harness.executor.model
    saved = model.fused
    if not fused:
        model.fused = None
    rng = random.Random(7)
    reqs = [harness.new([rng.randrange(3, 300) for _ in range(n)]) for n in (3, 9, 17, 4, 12)]
    harness.prefill(reqs)
    harness.decode(reqs, 4)
    late = harness.new([rng.randrange(3, 300) for _ in range(6)])
    harness.round([(r, r.num_tokens - 1, 1, True) for r in reqs[:2]] +
                  [(late, 0, late.prompt_len, True)], "mixed")
    harness.decode(reqs[:2], 2)
    model.fused = saved
    return [dict(harness.logits[r.id]) for r in reqs + [late]]


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_layers_give_the_same_logits(arch: str, tiny_models, make_harness,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_models[arch].path
    fused_h = make_harness(path, dtype=torch.bfloat16)
    plain_h = make_harness(path, dtype=torch.bfloat16)
    assert fused_h.executor.model.fused is not None
    layers = fused_h.executor.model.config.num_layers
    calls: list[int] = []
    real = ops.decode_layer

    def counting(*args: object, **kwargs: object) -> None:
        calls[-1] += 1
        real(*args, **kwargs)

    monkeypatch.setattr(ops, "decode_layer", counting)
    calls.append(0)
    fused = _run(fused_h, True)
    # 4 + 2 decode rounds fused, the prefill and the mixed round not
    assert calls[0] == 6 * layers
    calls.append(0)
    plain = _run(plain_h, False)
    assert calls[1] == 0
    assert len(fused) == len(plain) == 6
    for i, (f, p) in enumerate(zip(fused, plain)):
        assert f.keys() == p.keys() and f
        for pos in f:
            assert torch.equal(f[pos], p[pos]), (arch, i, pos)


def test_fused_path_only_for_bf16_and_a_few_rows(tiny_models, make_harness) -> None:
    path = tiny_models["llama"].path
    assert make_harness(path, dtype=torch.float32).executor.model.fused is None
    h = make_harness(path, dtype=torch.bfloat16)
    fused = h.executor.model.fused
    assert fused is not None
    x = torch.zeros(linear_kernels.NATIVE_DIRECT_ROWS + 1, 64, dtype=torch.bfloat16)
    assert fused.run(x, x, x, h.executor.attn) is None  # too many rows: layer by layer

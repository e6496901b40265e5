"""The mixture-of-experts MLP's two paths: one row (a single chat's decode step: its top_k
experts in turn) and many rows (sorted by expert, gathered, gathered back) both equal the
plain definition, sum over each token's top_k experts of weight * expert(x)."""
from __future__ import annotations

import pytest
import torch

from engine.execution.model.config import MoESpec
from engine.execution.model.layers.moe import MoEMLP

HIDDEN, INTER = 64, 32


def _moe(spec: MoESpec) -> MoEMLP:
    torch.manual_seed(0)
    moe = MoEMLP(HIDDEN, spec, "silu", torch.float32, "cpu")
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return moe.eval()


def _definition(moe: MoEMLP, x: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(x @ moe.gate.weight.T, dim=-1)
    weights, chosen = torch.topk(probs, moe.spec.top_k, dim=-1)
    if moe.spec.normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t], chosen[t], strict=True):
            out[t] += w * moe.experts[int(e)](x[t:t + 1])[0]
    return out


@pytest.mark.parametrize("spec", [MoESpec(8, 2, INTER), MoESpec(16, 4, INTER, False)])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_moe_paths_equal_the_definition(spec: MoESpec, rows: int) -> None:
    moe = _moe(spec)
    x = torch.randn(rows, HIDDEN)
    with torch.inference_mode():
        got, want = moe(x), _definition(moe, x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        if rows > 1:  # each row alone (the one-row path) gives its row of the batch
            alone = torch.cat([moe(x[t:t + 1]) for t in range(rows)])
            torch.testing.assert_close(alone, got, atol=1e-5, rtol=1e-5)

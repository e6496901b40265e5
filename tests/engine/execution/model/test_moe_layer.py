"""The mixture-of-experts MLP's paths: one row (a single chat's decode step: its top_k experts
in turn), many rows (sorted by expert, gathered, gathered back) and, over quantized experts,
the native call (csrc/moe.c) all equal the plain definition, sum over each token's top_k
experts of weight * expert(x)."""
from __future__ import annotations

import pytest
import torch

from engine.execution.model.config import MoESpec
from engine.execution.model.layers import Linear
from engine.execution.model.layers import moe as moe_layer
from engine.execution.model.layers.moe import MoEMLP
from engine.kernels import quant

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


def _quantized(spec: MoESpec) -> tuple[MoEMLP, MoEMLP]:
    """(the MoE with Q8_0 experts, the same with their dequantized float weights)."""
    moe, ref = _moe(spec), _moe(spec)
    for q, r in zip(moe.experts, ref.experts, strict=True):
        for name in ("gate_up_proj", "down_proj"):
            lq, lr = getattr(q, name), getattr(r, name)
            w = quant.quantize(lq.weight.detach(), quant.Q8_0)
            lq.set_quantized(w)
            with torch.no_grad():
                lr.weight.copy_(quant.dequantize(w))
    for m in (moe, ref):
        for lin in m.modules():
            if isinstance(lin, Linear):
                lin.pack()
    return moe, ref


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("spec", [MoESpec(8, 2, INTER), MoESpec(16, 4, INTER, False)])
def test_native_moe_over_quantized_experts(spec: MoESpec, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    # one call (csrc/moe.c) for any round, in slices of NATIVE_ROWS; a row's bits do not
    # depend on the rows beside it where experts have a few rows each (their products share
    # one OpenMP region) on any CPU, and without AMX where they have many (with it, an
    # expert's many rows multiply in AMX tiles, as a Linear's do); close to the definition
    # on the dequantized weights
    moe, ref = _quantized(spec)
    assert moe.native() is not None and ref.native() is None
    x = torch.randn(80, HIDDEN, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got = moe(x)
        few = moe(x[:6])  # every expert under 8 rows: all their products share one region
        for t in (0, 3, 5):
            assert torch.equal(moe(x[t:t + 1])[0], few[t])
        if not quant.uses_amx(moe.experts[0].gate_up_proj.weight):
            for t in (0, 5, 79):
                assert torch.equal(moe(x[t:t + 1])[0], got[t])
        want = _definition(ref, x)
        err = (got - want).norm(dim=1) / want.norm(dim=1)
        assert float(err.max()) < 0.03
        parts = [moe(x[:32]), moe(x[32:64]), moe(x[64:])]
        monkeypatch.setattr(moe_layer, "NATIVE_ROWS", 32)  # 80 rows: slices of 32, 32, 16
        assert torch.equal(moe(x), torch.cat(parts))
        torch_path = moe.by_expert(x)  # the torch path over the same blocks
        err = (torch_path - want).norm(dim=1) / want.norm(dim=1)
        assert float(err.max()) < 0.03


@pytest.mark.parametrize("spec", [MoESpec(8, 2, INTER), MoESpec(16, 4, INTER, False)])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_device_routing_equals_the_definition(spec: MoESpec, rows: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Ferry's kernels (as on a GPU) the routing stays on the device: gathered
    experts for few (token, expert) pairs, every expert with a dense routing for more; the
    experts keep views of the stacks, so they still compute what the stacks do."""
    from engine.kernels import native

    monkeypatch.setattr(native, "library", lambda: None)
    moe = _moe(spec)
    x = torch.randn(rows, HIDDEN)
    with torch.inference_mode():
        got = moe(x)
        stacked = moe.stacked()
        assert stacked is not None
        assert moe.experts[1].gate_up_proj.weight.data_ptr() == stacked[0][1].data_ptr()
        torch.testing.assert_close(got, _definition(moe, x), atol=1e-5, rtol=1e-5)

"""The FlashInfer backend end to end on this CPU, over the stand-in flashinfer (tests/fakes):
every argument Ferry passes is checked as FlashInfer checks it, and the attention it computes
must give the torch backend's logits on tiny 64-wide-head models (query groups 1, 4, 8, a
sliding-window model through window_left, a mixture of experts). The start-up choice takes
FlashInfer only when its self-test passes, and says why not otherwise."""
from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from engine.execution.attention import choice
from engine.execution.attention.choice import BackendChoice
from engine.scheduling.request import Request

BF16 = torch.bfloat16


def lockstep(harnesses: list[Any], prompts: list[list[int]]) -> list[list[Request]]:
    """The same rounds on each harness (a prefill, a mixed round, decodes); every harness
    continues with the first one's tokens, so half-precision ties cannot split them."""
    reqs = [[h.new(p) for p in prompts] for h in harnesses]
    a, b, c, d = range(4)
    rounds = [
        lambda rs: [(rs[a], 0, 1, True), (rs[b], 0, 5, True), (rs[c], 0, 9, False)],
        lambda rs: [(rs[a], 1, 1, True), (rs[b], 5, 1, True), (rs[c], 9, 8, True),
                    (rs[d], 0, len(prompts[d]), True)],
        *[lambda rs: [(r, r.num_tokens - 1, 1, True) for r in rs]] * 4,
    ]
    for work in rounds:
        for h, rs in zip(harnesses, reqs):
            h.round(work(rs))
        for rs in reqs[1:]:
            for lead, r in zip(reqs[0], rs):
                r.output_ids[:] = lead.output_ids
    return reqs


def assert_same_logits(harnesses: list[Any], reqs: list[list[Request]]) -> None:
    ref = harnesses[0]
    for h, rs in zip(harnesses[1:], reqs[1:]):
        for lead, r in zip(reqs[0], rs):
            assert h.logits[r.id].keys() == ref.logits[lead.id].keys()
            for pos, row in ref.logits[lead.id].items():
                torch.testing.assert_close(h.logits[r.id][pos], row, atol=6e-2, rtol=5e-2)


@pytest.mark.parametrize("model", ["group1", "group4", "group8", "sliding", "moe"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_backend_gives_the_torch_backends_logits(
        wide_models: dict[str, Path], make_harness: Any, as_on_cuda: ModuleType,
        model: str, page_size: int) -> None:
    kw: dict[str, Any] = {"page_size": page_size, "dtype": BF16}
    ref = make_harness(wide_models[model], backend="torch", **kw)
    fi = make_harness(wide_models[model], backend="flashinfer", **kw)
    assert fi.executor.attn.name == "flashinfer"
    if model == "sliding":  # the local layers' own wrapper, planned with window_left 5
        assert {k.window_left for k in fi.executor.attn.kinds} == {-1, 5}
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 320) for _ in range(n)] for n in (1, 5, 17, 40)]
    reqs = lockstep([ref, fi], prompts)
    assert_same_logits([ref, fi], reqs)
    kinds = {call for call in as_on_cuda.calls}
    assert kinds == {("decode", "plan"), ("decode", "run"), ("prefill", "plan"),
                     ("prefill", "run")}


def test_a_float16_cache_under_a_bfloat16_model(wide_models: dict[str, Path],
                                                make_harness: Any,
                                                as_on_cuda: ModuleType) -> None:
    """The kernels take q in the cache's type: the backend plans and converts so."""
    kw: dict[str, Any] = {"dtype": BF16, "kv_dtype": "float16"}
    ref = make_harness(wide_models["group4"], backend="torch", **kw)
    fi = make_harness(wide_models["group4"], **kw)
    assert fi.executor.attention.name == "flashinfer", fi.executor.attention.reason
    reqs = lockstep([ref, fi], [[5, 6, 7], [8] * 5, list(range(3, 20)), list(range(40, 80))])
    assert_same_logits([ref, fi], reqs)


def test_the_choice_takes_flashinfer_after_its_self_test(
        wide_models: dict[str, Path], make_harness: Any, as_on_cuda: ModuleType) -> None:
    ex = make_harness(wide_models["sliding"], dtype=BF16).executor
    assert ex.attention.name == "flashinfer"
    assert "self-test passed" in ex.attention.reason


def test_the_choice_says_why_not(wide_models: dict[str, Path], tiny_models: dict[str, Any],
                                 make_harness: Any, as_on_cuda: ModuleType,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def attention(path: Path, **kw: Any) -> BackendChoice:
        choice._tested.clear()
        att: BackendChoice = make_harness(path, **kw).executor.attention
        return att

    got = attention(wide_models["group4"], dtype=torch.float32)
    assert got.name == "torch" and "float32" in got.reason
    got = attention(tiny_models["llama"].path, dtype=BF16)  # 16-wide heads
    assert got.name == "torch" and "head sizes" in got.reason

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(as_on_cuda.BatchPrefillWithPagedKVCacheWrapper, "run", broken)
    got = attention(wide_models["group4"], dtype=BF16)
    assert got.name == "torch"
    assert "self-test" in got.reason and "no kernel image" in got.reason


def test_the_choice_without_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.execution.attention import flashinfer_plan as fp

    monkeypatch.setattr(fp, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(choice.importlib.util, "find_spec", lambda name: None)
    got = choice.choose(torch.device("cpu"), BF16, 4, 1, 64, 0.125, 16)
    assert got == BackendChoice("torch", "FlashInfer is not installed "
                                         "(pip install 'ferry[gpu]')")
    assert choice.choose(torch.device("cpu"), BF16, 4, 1, 64, 0.125, 16) == got
    monkeypatch.setattr(fp, "DEVICES", ("cuda",))
    assert choice.choose(torch.device("cpu"), BF16, 4, 1, 64, 0.125, 16).name == "torch"


def _wrapper(fake: ModuleType, kind: str = "prefill", workspace: torch.Tensor | None = None
             ) -> Any:
    ws = torch.zeros(128 << 20, dtype=torch.uint8) if workspace is None else workspace
    cls = (fake.BatchPrefillWithPagedKVCacheWrapper if kind == "prefill"
           else fake.BatchDecodeWithPagedKVCacheWrapper)
    return cls(ws, "HND")


def i32(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int32, device="cpu")


def test_the_stand_in_refuses_what_flashinfer_refuses(flashinfer_fake: ModuleType) -> None:
    fake = flashinfer_fake
    dirty = torch.zeros(128 << 20, dtype=torch.uint8)
    dirty[7] = 1
    with pytest.raises(ValueError, match="zero"):
        _wrapper(fake, workspace=dirty)
    w = _wrapper(fake)
    cache = torch.zeros(4, 2, 1, 16, 64, dtype=BF16)
    with pytest.raises(RuntimeError, match="plan"):
        w.run(torch.zeros(3, 4, 64, dtype=BF16), cache)
    args = (i32(0, 3), i32(0, 1), i32(0), i32(3), 4, 1)
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(*args, 16, 16, causal=True, q_data_type=BF16)
    with pytest.raises(ValueError, match="int32"):
        w.plan(torch.tensor([0, 3]), *args[1:], 64, 16, causal=True, q_data_type=BF16)
    with pytest.raises(ValueError, match="no kernel"):
        w.plan(*args, 64, 16, causal=True, q_data_type=BF16, kv_data_type=torch.float16)
    w.plan(*args, 64, 16, causal=True, q_data_type=BF16, window_left=3)
    with pytest.raises(ValueError, match="q_data_type"):
        w.run(torch.zeros(3, 4, 64, dtype=torch.float16), cache)
    with pytest.raises(ValueError, match="shape"):
        w.run(torch.zeros(3, 4, 64, dtype=BF16), torch.zeros(4, 2, 16, 1, 64, dtype=BF16))
    assert w.run(torch.ones(3, 4, 64, dtype=BF16), cache).shape == (3, 4, 64)

"""The fused decode path (one C call per layer) against the layer-by-layer path, bit for bit.

Both run the same kernels in the same order, so every logit must be identical, for every
architecture (biases, tied embeddings, MQA/GQA, Qwen3's q/k norms, Gemma 3's sandwich norms,
GELU-tanh, sliding window and per-layer ropes; Qwen3-MoE's experts over float32 activations);
the fused path must be taken exactly for decode-only rounds of up to NATIVE_DIRECT_ROWS
sequences. Two variants:
bf16 weights (on CPUs that emulate bf16), and float32 activations over quantized weights
(Q8_0 / Q4_0 at load, or fused projections whose parts mix block and float types) with a KV
pool in float32, bfloat16 or float16.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.execution.loading.loader import load_model
from engine.execution.model import linear_kernels
from engine.execution.model.fused_decode import MAX_ROWS
from engine.execution.model.layers import Linear, PackedLinear
from engine.kernels import layer_ops, quant

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3", "gemma3"]


# the fused path is for CPUs that emulate bf16: take it on any CPU here
pytestmark = pytest.mark.usefixtures("native_kernels", "emulated")


def _run(harness, fused: bool) -> list[dict[int, torch.Tensor]]:
    """Prefill 5 prompts (one round), decode 4 rounds of all 5, then a mixed round and 2 more
    decode rounds of 2; return the logits recorded per request and position."""
    ex = harness.executor
    saved = ex.fused
    if not fused:
        ex.fused = None
    rng = random.Random(7)
    reqs = [harness.new([rng.randrange(3, 300) for _ in range(n)]) for n in (3, 9, 17, 4, 12)]
    harness.prefill(reqs)
    harness.decode(reqs, 4)
    late = harness.new([rng.randrange(3, 300) for _ in range(6)])
    harness.round([(r, r.num_tokens - 1, 1, True) for r in reqs[:2]] +
                  [(late, 0, late.prompt_len, True)], "mixed")
    harness.decode(reqs[:2], 2)
    ex.fused = saved
    return [dict(harness.logits[r.id]) for r in reqs + [late]]


def _count_fused_layers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """calls[0] counts the layers the fused decode runs from now on."""
    calls = [0]
    real = layer_ops.decode_layers

    def counting(layers: Any, *args: Any, **kwargs: Any) -> None:
        calls[0] += len(layers)
        real(layers, *args, **kwargs)

    monkeypatch.setattr(layer_ops, "decode_layers", counting)
    return calls


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_layers_give_the_same_logits(arch: str, tiny_models, make_harness,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny_models[arch].path
    fused_h = make_harness(path, dtype=torch.bfloat16)
    plain_h = make_harness(path, dtype=torch.bfloat16)
    assert fused_h.executor.fused is not None
    layers = fused_h.executor.model.config.num_layers
    calls = _count_fused_layers(monkeypatch)
    fused = _run(fused_h, True)
    # 4 + 2 decode rounds fused, the prefill and the mixed round not
    assert calls[0] == 6 * layers
    calls[0] = 0
    plain = _run(plain_h, False)
    assert calls[0] == 0
    assert len(fused) == len(plain) == 6
    for i, (f, p) in enumerate(zip(fused, plain)):
        assert f.keys() == p.keys() and f
        for pos in f:
            assert torch.equal(f[pos], p[pos]), (arch, i, pos)


def test_fused_path_only_for_bf16_and_a_few_rows(tiny_models, make_harness) -> None:
    path = tiny_models["llama"].path
    assert make_harness(path, dtype=torch.float32).executor.fused is None
    h = make_harness(path, dtype=torch.bfloat16)
    fused = h.executor.fused
    assert fused is not None
    x = torch.zeros(linear_kernels.NATIVE_DIRECT_ROWS + 1, 64, dtype=torch.bfloat16)
    assert fused.run(x, [(x, x)], h.executor.attn) is None  # too many rows: layer by layer


# --- float32 activations over quantized weights --------------------------------------------

def _quant_executor(path: Path, qtypes: Callable[[str, int], int] | str,
                    pool_dtype: torch.dtype = torch.float32) -> ModelExecutor:
    """The tiny model with its decoder projections quantized: `qtypes` "q8_0" / "q4_0" as
    --quantize does, or a function (module name, part) -> ggml type per projection part (a
    fused projection's parts of different types become a SplitWeight); the pool in
    `pool_dtype`."""
    kv = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    cfg = EngineConfig(page_size=4, kv_tokens=8192, max_running=64, kv_dtype=kv[pool_dtype])
    if isinstance(qtypes, str):
        model = load_model(path, torch.float32, "cpu", qtypes)
    else:
        model = load_model(path, torch.float32, "cpu")
        for name, m in model.named_modules():
            if isinstance(m, Linear) and name.startswith("model.layers."):
                m.set_quantized(_weight(m, name, qtypes),
                                None if m.bias is None else m.bias.data)
    model.pack_weights()
    ex = ModelExecutor(model, cfg, "cpu", threads=1)
    assert ex.pool.dtype == pool_dtype
    return ex


def _block(w: torch.Tensor, qtype: int) -> quant.QuantWeight:
    """w [out, in] float32 as a QuantWeight of `qtype` (float types: their bytes as they are)."""
    floats = {quant.F32: torch.float32, quant.F16: torch.float16, quant.BF16: torch.bfloat16}
    if qtype not in floats:
        return quant.quantize(w, qtype)
    data = w.to(floats[qtype]).contiguous().view(torch.uint8)
    return quant.QuantWeight(qtype, data, w.shape[1], w.shape[0])


def _weight(m: Linear, name: str, qtypes: Callable[[str, int], int]) -> object:
    w = m.weight.detach().float()
    rows = list(m.shard_rows.values()) if isinstance(m, PackedLinear) else [(0, w.shape[0])]
    parts = tuple(_block(w[a:a + n], qtypes(name, i)) for i, (a, n) in enumerate(rows))
    if len({p.qtype for p in parts}) == 1:
        return _block(w, parts[0].qtype)
    return linear_kernels.SplitWeight(parts)


def _compare(fused_ex: ModelExecutor, plain_ex: ModelExecutor, harness_cls: type,
             monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused harness takes the fused path for exactly the 6 decode rounds; every logit
    equals the layer-by-layer one."""
    assert fused_ex.fused is not None and fused_ex.fused.dtype == torch.float32
    calls = _count_fused_layers(monkeypatch)
    fused = _run(harness_cls(fused_ex), True)
    assert calls[0] == 6 * fused_ex.model.config.num_layers
    plain = _run(harness_cls(plain_ex), False)
    assert calls[0] == 6 * fused_ex.model.config.num_layers
    for i, (f, p) in enumerate(zip(fused, plain)):
        assert f.keys() == p.keys() and f
        for pos in f:
            assert torch.equal(f[pos], p[pos]), (i, pos)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("arch", [*ARCHS, "qwen3_moe"])  # the MoE: float32 activations only
def test_fused_quantized_layers_give_the_same_logits(arch: str, qtype: str, tiny_models,
                                                     make_harness, monkeypatch) -> None:
    path = tiny_models[arch].path
    harness_cls = type(make_harness(path))
    _compare(_quant_executor(path, qtype), _quant_executor(path, qtype), harness_cls,
             monkeypatch)


@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_quantized_layers_over_a_16_bit_pool(arch: str, pool_dtype: torch.dtype,
                                                   tiny_models, make_harness,
                                                   monkeypatch) -> None:
    path = tiny_models[arch].path
    harness_cls = type(make_harness(path))
    fused, plain = (_quant_executor(path, "q8_0", pool_dtype) for _ in range(2))
    assert fused.attn.native and fused.pool.dtype == pool_dtype
    _compare(fused, plain, harness_cls, monkeypatch)


def _mixed(name: str, part: int) -> int:
    """q, k, v of three types; gate BF16 beside up Q8_0; o Q4_0; down F16."""
    if "qkv_proj" in name:
        return (quant.Q8_0, quant.Q4_0, quant.BF16)[part]
    if "gate_up_proj" in name:
        return (quant.BF16, quant.Q8_0)[part]
    return quant.Q4_0 if "o_proj" in name else quant.F16


@pytest.mark.parametrize("dots", [None, "plain"])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_fused_layers_over_split_and_float_parts(arch: str, dots: str | None, tiny_models,
                                                 make_harness, monkeypatch) -> None:
    # F16/BF16 parts at < 8 rows and block parts all run ferry_qmatmul on both paths: the same
    # bits, with the CPU's best dot products and with the plain-C ones
    path = tiny_models[arch].path
    harness_cls = type(make_harness(path))
    assert quant.force_path(dots) == (dots or quant.kernel_path())
    try:
        fused, plain = (_quant_executor(path, _mixed) for _ in range(2))
        qkv = fused.model.model.layers[0].self_attn.qkv_proj.weight
        assert isinstance(qkv, linear_kernels.SplitWeight) and len(qkv.parts) == 3
        _compare(fused, plain, harness_cls, monkeypatch)
    finally:
        quant.force_path(None)


def test_fused_layers_over_f32_blocks(tiny_models, make_harness, monkeypatch) -> None:
    # F32 weights too run ferry_qmatmul's float32 dot products on both paths at a few rows
    path = tiny_models["llama"].path
    harness_cls = type(make_harness(path))

    def f32_o(name: str, part: int) -> int:
        return quant.F32 if "o_proj" in name else _mixed(name, part)

    fused, plain = (_quant_executor(path, f32_o) for _ in range(2))
    _compare(fused, plain, harness_cls, monkeypatch)


def test_fused_quantized_path_declines_float_projections(tiny_models, make_harness) -> None:
    # a float32 model's projections are oneDNN-packed tensors, not ferry_weights
    path = tiny_models["llama"].path
    assert make_harness(path, dtype=torch.float32).executor.fused is None
    ex = _quant_executor(path, "q8_0")
    fused = ex.fused
    assert fused is not None
    x = torch.zeros(linear_kernels.NATIVE_DIRECT_ROWS + 1, 64)
    assert fused.run(x, [(x, x)], ex.attn) is None  # too many rows: layer by layer


@pytest.mark.model
def test_fused_layers_on_the_default_gguf_give_the_same_logits(model_dir: Path, tiny_models,
                                                               make_harness,
                                                               monkeypatch) -> None:
    # the real thing: SmolLM2's Q4_1 layers in their own blocks, one executor for both paths
    # (each run writes every K/V it reads)
    cfg = EngineConfig(page_size=16, kv_tokens=4096, max_running=8)
    ex = ModelExecutor.from_pretrained(model_dir, cfg, threads=2, progress=False)
    weight = ex.model.model.layers[0].self_attn.qkv_proj.weight
    assert isinstance(weight, quant.QuantWeight) and weight.qtype == quant.Q4_1
    harness_cls = type(make_harness(tiny_models["llama"].path))
    _compare(ex, ex, harness_cls, monkeypatch)


def test_fused_quantized_layers_up_to_their_row_limit(tiny_models, make_harness,
                                                      monkeypatch) -> None:
    # the fused layer takes rounds up to max_rows (MAX_ROWS where the AMX kernel takes the
    # many-row products, as C can; else below quant.many_rows(), from where quant_matmul
    # multiplies dequantized tiles instead), bit for bit; more go layer by layer
    path = tiny_models["qwen2"].path
    harness_cls = type(make_harness(path))
    calls = _count_fused_layers(monkeypatch)
    amx = quant.many_rows() == quant.MANY_ROWS_AMX  # AMX in force
    limit = _quant_executor(path, _mixed).fused.max_rows
    assert limit == (MAX_ROWS if amx else min(
        [quant.many_rows(t) - 1 for t in (quant.F16, quant.Q8_0)] + [MAX_ROWS]))
    q8_limit = _quant_executor(path, "q8_0").fused.max_rows
    assert q8_limit == (MAX_ROWS if amx else min(quant.many_rows(quant.Q8_0) - 1, MAX_ROWS))
    for n, weights, most in ((limit, _mixed, limit), (q8_limit, "q8_0", q8_limit),
                             (q8_limit + 1, "q8_0", q8_limit)):
        runs = []
        for fused in (True, False):
            calls[0] = 0
            h = harness_cls(_quant_executor(path, weights))
            if not fused:
                h.executor.fused = None
            rng = random.Random(3)
            reqs = [h.new([rng.randrange(3, 300) for _ in range(2 + i)]) for i in range(n)]
            h.prefill(reqs)
            h.decode(reqs, 3)
            layers = h.executor.model.config.num_layers
            assert calls[0] == (3 * layers if fused and n <= most else 0)
            runs.append([h.logits[r.id] for r in reqs])
        for f, p in zip(*runs):
            assert f.keys() == p.keys() and len(f) == 4
            for pos in f:
                assert torch.equal(f[pos], p[pos]), (n, pos)


def test_layer_by_layer_decode_rows_stay_below_the_many_row_products(tiny_models,
                                                                     monkeypatch) -> None:
    # without fused layers a speculative round must still stay below where quant_matmul turns
    # to AMX or tiles (on AMX CPUs 15 rows for the types in lanes, 7 for the others: here the
    # patched figure), not at 16: past it its rows' logits are not those of plain decoding
    # (greedy drafts then keep tokens plain decoding would not write)
    ex = _quant_executor(tiny_models["qwen2"].path, "q8_0")
    ex.fused = None
    assert ex.decode_rows == min(quant.many_rows(quant.Q8_0) - 1, 16)
    monkeypatch.setattr(quant, "many_rows", lambda qtype=None: quant.MANY_ROWS_AMX)
    assert ex.decode_rows == quant.MANY_ROWS_AMX - 1

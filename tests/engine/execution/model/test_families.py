"""Each model family Ferry runs, as a tiny seeded random model built by transformers, against
transformers float32: from safetensors, and from a GGUF written by tests/tools/hf_gguf.py.

The configs exercise what sets each family apart: Gemma 3's sliding window (shorter than the
prompts, so masking matters), its two ropes (linear scaling on the global layers), q/k norms,
four norms per layer, GELU-tanh and scaled embeddings; Mistral's window; Qwen2's q/k/v
biases; Qwen3's q/k norms. Widths hold whole K-quant blocks (256 values).

* safetensors, float32: logits equal HF's (atol 1e-4) through prefill, a chunked prefill
  across the window and decode rounds; greedy tokens identical;
* GGUF F32 / F16 / Q8_0 / Q4_K dequantised (--dtype float32): equal to HF on the weights the
  file holds; F32, Q8_0 and Q4_K in their own blocks (dtype auto): F32 equal, the others
  within 10% (relative L2 per row) of HF on those weights: activations are quantized to int8
  per block, an error that grows with depth (2-3% seen over Qwen3's 2 layers, 4-8% over
  Gemma's 6); a wrong tensor mapping is off by ~100%.
"""
from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.execution.model import registry
from tests.tools.hf_gguf import write_gguf
from tests.tools.random_hf import random_hf

VOCAB = 320
COMMON = {"vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
          "rms_norm_eps": 1e-6, "initializer_range": 0.05, "bos_token_id": 1,
          "eos_token_id": 2, "pad_token_id": 0}
WINDOW = 8  # shorter than the prompts


def _config(family: str) -> object:
    from transformers import (
        Gemma3TextConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    if family == "gemma3":
        return Gemma3TextConfig(
            **COMMON, num_hidden_layers=6, head_dim=64, query_pre_attn_scalar=64,
            sliding_window=WINDOW, rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0,
                                   "rope_theta": 1000000.0}})
    if family == "mistral":
        return MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=WINDOW,
                             tie_word_embeddings=False)
    if family == "phi3":  # fused qkv and gate_up as shipped
        return Phi3Config(**COMMON, num_hidden_layers=2, sliding_window=WINDOW,
                          tie_word_embeddings=False)
    if family == "phi3-longrope":  # original context 64: prompts below it use the short
        return Phi3Config(**{**COMMON, "num_key_value_heads": 4}, num_hidden_layers=2,
                          original_max_position_embeddings=64, rope_parameters={
                              "rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": [1.0 + i / 32 for i in range(32)],
                              "long_factor": [2.0 + i / 8 for i in range(32)]})
    if family == "qwen2":
        return Qwen2Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=True)
    if family == "qwen3_moe":  # 8 experts, 2 per token; the second layer dense
        return Qwen3MoeConfig(**COMMON, num_hidden_layers=2, head_dim=64, num_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=256,
                              norm_topk_prob=True, mlp_only_layers=[1],
                              tie_word_embeddings=False)
    return Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=64, tie_word_embeddings=False)


FAMILIES = ["gemma3", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Path, torch.nn.Module]:
    hf = random_hf(_config(request.param))
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, path, hf


def _logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def _run(h) -> list:
    """Three prompts longer than the window, one prefilled in two chunks; 4 decode rounds."""
    reqs = [h.new(_prompt(i, n)) for i, n in enumerate((20, 13, 5))]
    h.round([(reqs[0], 0, 7, False), (reqs[1], 0, 13, True), (reqs[2], 0, 5, True)])
    h.round([(reqs[0], 7, 13, True)])
    h.decode(reqs, 4)
    return reqs


def _compare(h, hf: torch.nn.Module, reqs: list, rel: float | None = None) -> None:
    """Every recorded row equals HF's (rel None; greedy tokens too), or lies within `rel`
    of it (relative L2)."""
    for req in reqs:
        ref = _logits(hf, req.prompt_ids + req.output_ids)
        assert h.logits[req.id]
        for pos, row in h.logits[req.id].items():
            if rel is None:
                torch.testing.assert_close(row, ref[pos], atol=1e-4, rtol=1e-4,
                                           msg=lambda m, w=f"{req.id} at {pos}": f"{w}: {m}")
            else:
                err = float((row - ref[pos]).norm() / ref[pos].norm())
                assert err < rel, (req.id, pos, err)
        if rel is None:
            for i, tok in enumerate(req.output_ids):
                assert tok == int(ref[req.prompt_len - 1 + i].argmax()), (req.id, i)


def test_registry_names_each_family(family) -> None:
    name, _, hf = family
    cls = registry.for_hf(hf.config.to_dict())
    cfg = cls.config_from_hf(hf.config.to_dict())
    assert cfg.model_type == hf.config.model_type in cls.hf_model_types
    if name in ("gemma3", "mistral", "phi3"):
        assert WINDOW in cfg.windows and cfg.max_context == 256
    if name == "gemma3":
        assert cfg.windows == (WINDOW,) * 5 + (None,) and cfg.layers[0].rope != cfg.layers[5].rope


def test_safetensors_match_transformers(family, make_harness) -> None:
    _, path, hf = family
    h = make_harness(path)
    _compare(h, hf, _run(h))


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q8_0, T.Q4_K])
def test_gguf_matches_transformers_on_its_weights(family, qtype: T, make_harness,
                                                  tmp_path: Path) -> None:
    name, _, hf = family
    path = tmp_path / f"{name}-{qtype.name}.gguf"
    ref = copy.deepcopy(hf)
    held = write_gguf(path, hf, qtype)
    ref.load_state_dict(held, strict=False)
    if ref.config.tie_word_embeddings:
        ref.tie_weights()
    h = make_harness(path)  # dtype float32: dequantised in memory
    assert h.executor.model.config.model_type == {"mistral": "llama",
                                                  "qwen3_moe": "qwen3moe"}.get(name, name)
    _compare(h, ref, _run(h))
    if qtype != T.F16:  # the file's own blocks: float32 ones stay float, so exact
        hq = make_harness(path, dtype="auto")
        assert hq.executor.model.quantized == (qtype != T.F32)
        if name == "qwen3_moe" and qtype != T.F32:  # one weight per expert, views of the map
            moe = hq.executor.model.model.layers[0].mlp
            downs = [e.down_proj.weight for e in moe.experts]
            assert len(downs) == 8 and all(d.data.numpy().base is not None for d in downs)
            assert len({d.data.data_ptr() for d in downs}) == 8
        # the quantized weights' rows run with int8 activations (in lanes, every round:
        # quant.MANY_ROWS_LANES): Gemma 3 Q8_0 lands at 0.105
        _compare(hq, ref, _run(hq), rel=None if qtype == T.F32 else 0.12)


def test_phi3_longrope_safetensors_match_transformers(make_harness, tmp_path: Path) -> None:
    """LongRoPE below the original context: the short factors, cos/sin scaled by
    sqrt(1 + ln(256 / 64) / ln 64)."""
    hf = random_hf(_config("phi3-longrope"))
    hf.save_pretrained(tmp_path)
    h = make_harness(tmp_path)
    rotary = h.executor.model.model.rotary[0]
    assert rotary.switch == 64 and rotary.attention_factor > 1.1
    _compare(h, hf, _run(h))


@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0])
def test_phi3_longrope_gguf_matches_transformers(make_harness, tmp_path: Path,
                                                 qtype: T) -> None:
    """LongRoPE from a GGUF: the factors from rope_factors_long / rope_factors_short and the
    scale from rope.scaling.attn_factor, as llama.cpp's converter writes them (names from
    gguf-py), equal to the config's; logits equal HF's on the weights the file holds."""
    hf = random_hf(_config("phi3-longrope"))
    path = tmp_path / f"phi3-longrope-{qtype.name}.gguf"
    ref = copy.deepcopy(hf)
    ref.load_state_dict(write_gguf(path, hf, qtype), strict=False)
    h = make_harness(path)
    rope = h.executor.model.config.layers[0].rope
    params = hf.config.rope_parameters
    assert rope.kind == "longrope" and rope.params["original_max_position_embeddings"] == 64
    assert rope.params["long_factor"] == pytest.approx(params["long_factor"])
    assert rope.params["short_factor"] == pytest.approx(params["short_factor"])
    rotary = h.executor.model.model.rotary[0]
    assert rotary.switch == 64 and rotary.attention_factor == pytest.approx(
        (1 + math.log(256 / 64) / math.log(64)) ** 0.5, rel=1e-6)
    base = 1.0 / (10000.0 ** (torch.arange(0, 64, 2).float() / 64))
    torch.testing.assert_close(rotary.long_inv_freq,
                               base / torch.tensor(params["long_factor"]))
    _compare(h, ref, _run(h))


def test_phi3_longrope_gguf_with_wrong_factors_is_refused(tmp_path: Path) -> None:
    import gguf

    from engine.execution.errors import ModelFileError
    from engine.execution.loading.gguf_file import GGUFFile

    hf = random_hf(_config("phi3-longrope"))
    hf.config.rope_parameters["long_factor"] = [1.0] * 8  # not one per frequency
    path = tmp_path / "bad.gguf"
    write_gguf(path, hf, T.F32)
    with pytest.raises(ModelFileError, match=r"rope_factors_long\.weight holds 8 factors"):
        GGUFFile(path)
    assert gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FACTORS_LONG] == "rope_factors_long"


@pytest.mark.usefixtures("native_kernels")
def test_fused_decode_masks_the_window_as_the_layer_path_does(
        make_harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mistral's window in the fused C layer (float32 over Q8_0 blocks): bit for bit the
    layer-by-layer path's logits."""
    from engine.kernels import layer_ops

    hf = random_hf(_config("mistral"))
    path = tmp_path / "mistral-q8.gguf"
    write_gguf(path, hf, T.Q8_0)
    fused, plain = make_harness(path, dtype="auto"), make_harness(path, dtype="auto")
    assert fused.executor.fused is not None
    plain.executor.fused = None
    calls = [0]
    real = layer_ops.decode_layers

    def counting(layers: Any, *args: Any) -> None:
        calls[0] += len(layers)
        real(layers, *args)

    monkeypatch.setattr(layer_ops, "decode_layers", counting)
    a, b = _run(fused), _run(plain)
    assert calls[0] == 4 * 2  # 4 decode rounds x 2 layers
    for ra, rb in zip(a, b):
        assert ra.output_ids == rb.output_ids
        for pos, row in fused.logits[ra.id].items():
            assert torch.equal(row, plain.logits[rb.id][pos]), (ra.id, pos)

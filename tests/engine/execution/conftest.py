"""Fixtures of the execution tests that stand in for a GPU (tests/fakes/stand_ins.py)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes.stand_ins import fake_flashinfer, kernels_off


@pytest.fixture
def flashinfer_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-in flashinfer, importable, and the FlashInfer backend allowed on CPU."""
    with fake_flashinfer(monkeypatch) as module:
        yield module


@pytest.fixture
def as_on_cuda(monkeypatch: pytest.MonkeyPatch,
               flashinfer_fake: ModuleType) -> ModuleType:
    """The code path a CUDA machine runs, on this CPU: C kernels off, FlashInfer stand-in."""
    kernels_off(monkeypatch)
    return flashinfer_fake


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random checkpoints with 64-wide heads (FlashInfer's prefill takes 64, 128, 256):
    query groups of 1, 4 and 8, a sliding-window model and a mixture of experts."""
    from transformers import Gemma3TextConfig, Qwen3Config, Qwen3MoeConfig

    from tests.tools.random_hf import random_hf

    common = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "head_dim": 64, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
              "tie_word_embeddings": False}
    configs = {
        "group1": Qwen3Config(**common, num_attention_heads=2, num_key_value_heads=2),
        "group4": Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=1),
        "group8": Qwen3Config(**common, num_attention_heads=8, num_key_value_heads=1),
        "sliding": Gemma3TextConfig(
            **{**common, "num_hidden_layers": 3}, num_attention_heads=4,
            num_key_value_heads=2, query_pre_attn_scalar=64, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
        "moe": Qwen3MoeConfig(**common, num_attention_heads=4, num_key_value_heads=2,
                              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True),
    }
    out = {}
    for name, cfg in configs.items():
        path = tmp_path_factory.mktemp(f"wide-{name}")
        random_hf(cfg).save_pretrained(path)
        out[name] = path
    return out

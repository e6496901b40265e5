"""FlashInfer backend vs the torch reference on the same weights, on a real GPU (CUDA only):
head sizes 64 and 128 (FlashInfer's prefill kernels take 64, 128 and 256), query groups of
1, 4 and 8, page sizes 1 and 16, a sliding-window model through window_left, and the start-up
choice taking FlashInfer after its self-test."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from test_flashinfer_fake import assert_same_logits, lockstep

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                       reason="needs flashinfer-python"),
]


def _model(tmp_path: Path, head_dim: int, heads: int, kv_heads: int) -> Path:
    from transformers import Qwen3Config

    from tests.tools.random_hf import random_hf

    cfg = Qwen3Config(vocab_size=320, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, head_dim=head_dim, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=512,
                      rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=False)
    random_hf(cfg).save_pretrained(tmp_path)
    return tmp_path


def _compare(path: Path, make_harness: Any, page_size: int) -> None:
    kw: dict[str, Any] = {"page_size": page_size, "dtype": torch.bfloat16, "device": "cuda"}
    ref = make_harness(path, backend="torch", **kw)
    fi = make_harness(path, **kw)  # chosen at start-up: FlashInfer once its self-test passes
    assert fi.executor.attention.name == "flashinfer", fi.executor.attention.reason
    prompts = [[(7 * i + n) % 317 + 3 for i in range(n)] for n in (1, 5, 17, 40)]
    assert_same_logits([ref, fi], lockstep([ref, fi], prompts))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_matches_torch_backend(tmp_path: Path, make_harness: Any, head_dim: int,
                                          group: int, page_size: int) -> None:
    kv_heads = 2 if group == 1 else 1
    _compare(_model(tmp_path, head_dim, kv_heads * group, kv_heads), make_harness, page_size)


def test_flashinfer_runs_sliding_windows(wide_models: dict[str, Path],
                                         make_harness: Any) -> None:
    _compare(wide_models["sliding"], make_harness, 16)

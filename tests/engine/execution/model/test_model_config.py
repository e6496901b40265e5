"""Reading HF config.json dicts: transformers 4 and 5 layouts, families, refusals."""
from __future__ import annotations

import pytest
import torch

from engine.execution.loading.loader import choose_dtype
from engine.execution.model.config import UnsupportedModel
from engine.execution.model.layers import rope_inv_freq
from engine.execution.model.registry import config_from_hf

BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512}


def test_transformers_4_and_5_rope_layouts_agree() -> None:
    v4 = config_from_hf({**BASE, "rope_theta": 5e5, "rope_scaling": {
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}})
    v5 = config_from_hf({**BASE, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
    assert v4.layers[0].rope == v5.layers[0].rope and v4.layers[0].rope.theta == 5e5
    assert torch.equal(rope_inv_freq(16, v4.layers[0].rope), rope_inv_freq(16, v5.layers[0].rope))
    plain = config_from_hf(BASE)
    assert plain.layers[0].rope.theta == 10000.0 and plain.num_kv_heads == 4
    assert plain.head_dim == 16


def test_family_specifics() -> None:
    qwen2 = config_from_hf({**BASE, "model_type": "qwen2", "use_sliding_window": False,
                                 "sliding_window": 128})
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.max_context == 512
    qwen3 = config_from_hf({**BASE, "model_type": "qwen3", "head_dim": 32})
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.qkv_bias
    mistral = config_from_hf({**BASE, "model_type": "mistral", "sliding_window": 256})
    # every layer masked to its window: the model's whole context stays exact
    assert mistral.windows == (256, 256) and mistral.max_context == 512
    sliding = config_from_hf({**BASE, "model_type": "qwen3", "use_sliding_window": True,
                              "sliding_window": 64, "max_window_layers": 1})
    assert sliding.windows == (None, 64)


@pytest.mark.parametrize("change", [{"model_type": "gpt2"}, {"hidden_act": "gelu"},
                                    {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}])
def test_unsupported_configs_are_refused(change: dict) -> None:
    with pytest.raises(UnsupportedModel):
        config_from_hf({**BASE, **change})


def test_dtype_choice() -> None:
    assert choose_dtype("float32", "cpu") is torch.float32
    assert choose_dtype("bfloat16", "cpu") is torch.bfloat16
    assert choose_dtype("auto", "cpu") in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError):
        choose_dtype("int3", "cpu")

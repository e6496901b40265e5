"""Random tiny Hugging Face models: the reference side of the model tests (conftest's tiny
checkpoints, test_gguf's K-quant Llama)."""
from __future__ import annotations

from typing import Any

import torch


def random_hf(cfg: Any, model_class: Any = None) -> torch.nn.Module:
    """The causal LM of `cfg` (or `model_class`'s model) with seeded random weights, float32,
    in eval mode. Norm weights and biases are drawn too: HF initialises them to 1 and 0, which
    would hide mapping mistakes."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    if model_class is not None:
        hf: torch.nn.Module = model_class(cfg).to(torch.float32).eval()
    else:
        hf = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name.lower():  # BERT's are LayerNorm
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
    return hf

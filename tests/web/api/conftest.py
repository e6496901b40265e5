"""The API tests' reference: Hugging Face transformers on the same weights as the server (a
GGUF file is dequantized by transformers' own GGUF reader, a folder is loaded as it is)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def hf_model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    path = Path(model_dir)
    if path.is_dir():
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # a .gguf: transformers dequantizes every tensor to float32 (slow: kept as safetensors)
    cache = Path(os.environ.get("FERRY_TEST_MODEL_CACHE") or
                 Path(tempfile.gettempdir()) / "ferry-test-model-cache")
    saved = cache / f"hf-reference-{path.stem}-{path.stat().st_size}"
    if (saved / "config.json").exists():
        return AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    model.hf_quantizer = None  # the tensors are plain float32 now: save them as such
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(saved)
    return model.eval()

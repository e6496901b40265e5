"""Which architecture class runs a checkpoint: Hugging Face `model_type` or GGUF
`general.architecture` -> a CausalLM subclass (one file per architecture).

Adding a dense architecture is one file (its config reading, GGUF names and, where its layers
differ, a `make_layer`) and one line in ARCHITECTURES.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.execution.model.architectures import bert
from engine.execution.model.architectures.gemma3 import Gemma3ForCausalLM
from engine.execution.model.architectures.llama import LlamaForCausalLM
from engine.execution.model.architectures.phi3 import Phi3ForCausalLM
from engine.execution.model.architectures.qwen2 import Qwen2ForCausalLM
from engine.execution.model.architectures.qwen3 import Qwen3ForCausalLM
from engine.execution.model.architectures.qwen3_moe import Qwen3MoeForCausalLM
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM

ARCHITECTURES: tuple[type[CausalLM], ...] = (
    LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM,
    Qwen3MoeForCausalLM,
)

HF_TYPES: dict[str, type[CausalLM]] = {t: a for a in ARCHITECTURES for t in a.hf_model_types}
GGUF_ARCHS: dict[str, type[CausalLM]] = {t: a for a in ARCHITECTURES for t in a.gguf_archs}
SUPPORTED = tuple(HF_TYPES)  # config.json model_type values Ferry runs
# encoders (embedding models, run by engine.execution.encoder): model_type -> family module
ENCODERS: dict[str, ModuleType] = {t: bert for t in bert.HF_MODEL_TYPES}


def is_encoder_folder(folder: Path) -> bool:
    """A safetensors folder whose config.json names an encoder family (an embedding model)."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") in ENCODERS
    except (ValueError, OSError):
        return False


def for_hf(cfg: Mapping[str, Any]) -> type[CausalLM]:
    kind = cfg.get("model_type")
    if kind not in HF_TYPES:
        raise UnsupportedModel(f"model_type {kind!r} is not supported "
                               f"(supported: {', '.join(HF_TYPES)})")
    return HF_TYPES[str(kind)]


def for_gguf(arch: str) -> type[CausalLM] | None:
    return GGUF_ARCHS.get(arch)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """A config.json dict (transformers 4 or 5 layout) as the ModelConfig of its class."""
    return for_hf(cfg).config_from_hf(cfg)


def model_class(cfg: ModelConfig) -> type[CausalLM]:
    """The class of a ModelConfig read by either path (model_type: a registry name)."""
    cls = HF_TYPES.get(cfg.model_type) or GGUF_ARCHS.get(cfg.model_type)
    if cls is None:
        raise UnsupportedModel(f"no architecture {cfg.model_type!r}")
    return cls

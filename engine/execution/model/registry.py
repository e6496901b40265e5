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

from engine.execution.model.architectures.encoders import bert
from engine.execution.model.architectures.text.gemma3 import Gemma3ForCausalLM
from engine.execution.model.architectures.text.llama import LlamaForCausalLM
from engine.execution.model.architectures.text.phi3 import Phi3ForCausalLM
from engine.execution.model.architectures.text.qwen2 import Qwen2ForCausalLM
from engine.execution.model.architectures.text.qwen3 import Qwen3ForCausalLM
from engine.execution.model.architectures.text.qwen3_moe import Qwen3MoeForCausalLM
from engine.execution.model.architectures.vision.gemma3_vision import Gemma3ForConditionalGeneration
from engine.execution.model.architectures.vision.idefics3 import Idefics3ForConditionalGeneration
from engine.execution.model.architectures.vision.llava import LlavaForConditionalGeneration
from engine.execution.model.architectures.vision.llava_next import LlavaNextForConditionalGeneration
from engine.execution.model.architectures.vision.mistral3 import Mistral3ForConditionalGeneration
from engine.execution.model.architectures.vision.qwen2_5_vl import (
    Qwen2_5_VLForConditionalGeneration,
)
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM
from engine.execution.model.pooling import has_pooling_module

ARCHITECTURES: tuple[type[CausalLM], ...] = (
    LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM,
    Qwen3MoeForCausalLM, LlavaForConditionalGeneration, Idefics3ForConditionalGeneration,
    Gemma3ForConditionalGeneration, Qwen2_5_VLForConditionalGeneration,
    LlavaNextForConditionalGeneration, Mistral3ForConditionalGeneration,
)

HF_TYPES: dict[str, type[CausalLM]] = {t: a for a in ARCHITECTURES for t in a.hf_model_types}
GGUF_ARCHS: dict[str, type[CausalLM]] = {t: a for a in ARCHITECTURES for t in a.gguf_archs}
# llama.cpp projector files' clip.projector_type -> the vision family over a text GGUF
PROJECTORS: dict[str, type[CausalLM]] = {a.projector_type: a for a in ARCHITECTURES
                                         if a.projector_type}
PROJECTOR_TYPES = tuple(PROJECTORS)
SUPPORTED = tuple(HF_TYPES)  # config.json model_type values Ferry runs
# encoders (embedding models, run by engine.execution.encoder): model_type -> family module
ENCODERS: dict[str, ModuleType] = {t: bert for t in bert.HF_MODEL_TYPES}


# decoder families that also make embeddings (model.embedding_decoder), as a
# sentence-transformers folder: Qwen3-Embedding, EmbeddingGemma
EMBEDDING_DECODERS = ("qwen3", "gemma3_text")


# decoder rerankers saved as a sequence classifier of one label: Qwen3-Reranker converted so
# (its `score` row is the LM head's "yes" row minus its "no" row), as vLLM and
# sentence-transformers' CrossEncoder load it
DECODER_SCORERS = ("Qwen3ForSequenceClassification",)


def is_decoder_scorer(cfg: Mapping[str, Any]) -> bool:
    """config.json of a decoder reranker (DECODER_SCORERS, one label)."""
    return any(a in DECODER_SCORERS for a in cfg.get("architectures") or []) \
        and len(cfg.get("id2label") or {"0": ""}) == 1


# Qwen3-Reranker as Qwen publishes it: a plain Qwen3ForCausalLM that only its name and its
# model card's title tell apart from a chat model (llama.cpp's converter reads the same hints)
RERANKER_NAME = "qwen3-reranker"


def is_decoder_reranker(folder: Path, cfg: Mapping[str, Any]) -> bool:
    """config.json and folder of Qwen3-Reranker as published (a causal LM whose head's "yes"
    and "no" rows score): its folder's name (or, in a Hugging Face cache, its repository's),
    its `_name_or_path` or its README's title names it."""
    if cfg.get("model_type") != "qwen3" or is_decoder_scorer(cfg):
        return False
    folder = Path(folder)
    names = [folder.name, str(cfg.get("_name_or_path") or "")]
    if folder.parent.name == "snapshots":  # hub cache: models--Qwen--Qwen3-Reranker-0.6B
        names.append(folder.parent.parent.name.replace("--", "/"))
    if any(RERANKER_NAME in name.lower() for name in names):
        return True
    try:
        with (folder / "README.md").open(encoding="utf-8", errors="replace") as card:
            head = card.read(64 * 1024)
    except OSError:
        return False
    return any(line.strip().lower().startswith(f"# {RERANKER_NAME}")
               for line in head.splitlines())


def is_embedding_decoder(folder: Path, cfg: Mapping[str, Any]) -> bool:
    """A decoder family's folder with a sentence-transformers Pooling module, saved as a
    one-label sequence classifier (a reranker), or Qwen3-Reranker as published."""
    return cfg.get("model_type") in EMBEDDING_DECODERS and (
        has_pooling_module(Path(folder)) or is_decoder_scorer(cfg)
        or is_decoder_reranker(folder, cfg))


def is_bert_folder(folder: Path) -> bool:
    """A safetensors folder whose config.json names an encoder family (BERT)."""
    config = Path(folder) / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("model_type") in ENCODERS
    except (ValueError, OSError):
        return False


def is_encoder_folder(folder: Path) -> bool:
    """A safetensors folder of an embedding model: its config.json names an encoder family,
    or a decoder family that its sentence-transformers files pool."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        cfg = json.loads(config.read_text())
    except (ValueError, OSError):
        return False
    return cfg.get("model_type") in ENCODERS or is_embedding_decoder(folder, cfg)


def is_embedding_model(path: Path) -> bool:
    """An embedding model Ferry runs with its encoder executor: an encoder folder, or a
    GGUF file of an encoder architecture (llama.cpp's `bert`)."""
    path = Path(path)
    if path.is_dir():
        return is_encoder_folder(path)
    if path.is_file() and path.suffix == ".gguf":
        from engine.execution.loading.encoder_gguf import is_encoder_gguf

        return is_encoder_gguf(path)
    return False


def embedding_task(path: Path) -> str | None:
    """What an embedding model's files do, before they load: "score" for a cross-encoder
    (a BERT or RoBERTa sequence classifier, its GGUF, Qwen3-Reranker as published, as its
    GGUF or as a sequence classifier), "embed" for the others; None for a model that is not one
    (engine.Engine.task's words)."""
    if not is_embedding_model(path):
        return None
    if Path(path).is_dir():
        cfg = json.loads((Path(path) / "config.json").read_text())
        if any(a in bert.SCORERS for a in cfg.get("architectures") or []) \
                or is_decoder_scorer(cfg) or is_decoder_reranker(Path(path), cfg):
            return "score"
    else:
        from engine.execution.loading.encoder_gguf import (
            RANK,
            decoder_pooling_type,
            is_cross_encoder_gguf,
        )

        # Qwen3-Reranker's GGUF; an XLM-RoBERTa cross-encoder's (bge-reranker)
        if decoder_pooling_type(path) == RANK or is_cross_encoder_gguf(path):
            return "score"
    return "embed"


def for_hf(cfg: Mapping[str, Any]) -> type[CausalLM]:
    kind = cfg.get("model_type")
    if kind == "llava" and (cfg.get("vision_config") or {}).get("model_type") == "pixtral":
        return Mistral3ForConditionalGeneration  # Pixtral 12B: Mistral 3 less the merger
    if kind not in HF_TYPES:
        raise UnsupportedModel(f"model_type {kind!r} is not supported "
                               f"(supported: {', '.join(HF_TYPES)})")
    return HF_TYPES[str(kind)]


def for_gguf(arch: str) -> type[CausalLM] | None:
    return GGUF_ARCHS.get(arch)


def for_projector(kind: str, pinpoints: bool = False) -> type[CausalLM] | None:
    """The family of a projector file of type `kind`; `pinpoints`: the file has LLaVA 1.6's
    image_grid_pinpoints (llama.cpp's legacy script writes it as an `mlp` one, as 1.5's)."""
    if pinpoints and kind == LlavaForConditionalGeneration.projector_type:
        return LlavaNextForConditionalGeneration
    return PROJECTORS.get(kind)


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """A config.json dict (transformers 4 or 5 layout) as the ModelConfig of its class."""
    return for_hf(cfg).config_from_hf(cfg)


def model_class(cfg: ModelConfig) -> type[CausalLM]:
    """The class of a ModelConfig read by either path (model_type: a registry name)."""
    cls = HF_TYPES.get(cfg.model_type) or GGUF_ARCHS.get(cfg.model_type)
    if cls is None:
        raise UnsupportedModel(f"no architecture {cfg.model_type!r}")
    return cls

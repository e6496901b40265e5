"""LLaVA (1.5 and the models built like it): a CLIP vision tower, a two-layer MLP projector,
and a Llama text model; each `<image>` in the prompt stands for one image's patches.

The tower runs up to `vision_feature_layer` (-2: all but its last layer) and, with the
"default" strategy, drops the class token: 576 positions per 336-pixel image at patch 14.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine.execution.model.architectures.llama import LlamaForCausalLM
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM
from engine.execution.model.encoder_steps import EncoderSteps
from engine.execution.model.vision import (
    ClipVisionTower,
    MLPProjector,
    TowerConfig,
    VisionConfig,
    with_vision,
)
from engine.vision import ProcessorConfig

# checkpoint prefixes (transformers 4 and 5 layouts) -> this model's module names
RENAMES = (("model.language_model.", "model."), ("language_model.model.", "model."),
           ("language_model.lm_head.", "lm_head."), ("model.vision_tower.", "vision_tower."),
           ("vision_tower.vision_model.", "vision_tower."),
           ("model.multi_modal_projector.", "multi_modal_projector."))


# CLIP ViT-L/14 at 336 pixels (LLaVA 1.5's), where a checkpoint's vision_config is silent
CLIP_L = TowerConfig(hidden_size=1024, intermediate_size=4096, num_heads=16, layers=24,
                     image_size=336, patch_size=14, layer_norm_eps=1e-5,
                     hidden_act="quick_gelu", class_token=True)


def _tower(cfg: Mapping[str, Any], feature_layer: int) -> TowerConfig:
    total = int(cfg.get("num_hidden_layers", CLIP_L.layers))
    used = total + 1 + feature_layer if feature_layer < 0 else feature_layer
    if not 0 < used <= total:
        raise UnsupportedModel(f"vision_feature_layer {feature_layer} is outside the "
                               f"tower's {total} layers")
    return TowerConfig.from_hf(cfg, CLIP_L, layers=used)


class LlavaForConditionalGeneration(CausalLM):
    hf_model_types = ("llava",)

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        text = dict(cfg.get("text_config") or {})
        if text.get("model_type", "llama") not in ("llama", "mistral"):
            raise UnsupportedModel(f"LLaVA over a {text.get('model_type')!r} text model is "
                                   "not supported (supported: llama, mistral)")
        text.setdefault("model_type", "llama")
        vision = cfg.get("vision_config") or {}
        if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
            raise UnsupportedModel(f"LLaVA with a {vision.get('model_type')!r} tower is not "
                                   "supported (supported: clip_vision_model)")
        layer = cfg.get("vision_feature_layer", -2)
        strategy = cfg.get("vision_feature_select_strategy", "default")
        if not isinstance(layer, int) or strategy not in ("default", "full"):
            raise UnsupportedModel(f"vision_feature_layer {layer!r} with strategy "
                                   f"{strategy!r} is not supported (one layer; default, full)")
        if str(cfg.get("projector_hidden_act", "gelu")) != "gelu":
            raise UnsupportedModel("projector_hidden_act must be gelu")
        tower = _tower(vision, layer)
        token = cfg.get("image_token_index", cfg.get("image_token_id", 32000))
        spec = VisionConfig(tower, int(token),
                            tower.num_patches + (strategy == "full"), "<image>",
                            ProcessorConfig(shortest_edge=tower.image_size,
                                            crop=(tower.image_size, tower.image_size)))
        return with_vision(LlamaForCausalLM.config_from_hf(text), "llava", spec, cfg)

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        spec: VisionConfig = cfg.vision
        where = device if device is not None else "cpu"
        self.vision_tower = ClipVisionTower(spec.vit, dtype, where)
        self.multi_modal_projector = MLPProjector(spec.vit.hidden_size, cfg.hidden_size,
                                                  "gelu", True, dtype, where)
        self.keep_class_token = spec.tokens_per_image > spec.vit.num_patches

    @classmethod
    def hf_key(cls, key: str) -> str:
        for old, new in RENAMES:
            if key.startswith(old):
                key = new + key[len(old):]
        return key

    def skip_key(self, key: str) -> bool:
        """The tower's layers after the feature layer and its post-layernorm: never run."""
        if key.startswith("vision_tower.post_layernorm.") \
                or key == "vision_tower.embeddings.position_ids":
            return True
        if key.startswith("vision_tower.encoder.layers."):
            return int(key.split(".")[3]) >= int(self.config.vision.vit.layers)
        return super().skip_key(key)

    def encode_steps(self, pixels: torch.Tensor,
                     grid: tuple[int, int] | None = None) -> EncoderSteps:
        features = yield from self.vision_tower.steps(pixels.to(self.dtype))
        if not self.keep_class_token:
            features = features[:, 1:]
        b, n, d = features.shape
        rows: torch.Tensor = self.multi_modal_projector(features.reshape(b * n, d))
        return rows.view(b, n, -1)

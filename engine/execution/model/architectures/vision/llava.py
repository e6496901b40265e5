"""LLaVA (1.5 and the models built like it): a CLIP vision tower, a two-layer MLP projector,
and a Llama text model; each `<image>` in the prompt stands for one image's patches.

The tower runs up to `vision_feature_layer` (-2: all but its last layer) and, with the
"default" strategy, drops the class token: 576 positions per 336-pixel image at patch 14.

From GGUF: the text model's file (a `llama` one) and the projector file llama.cpp's legacy
scripts write for LLaVA 1.5 (`convert_image_encoder_to_gguf.py --llava-projector`,
projector type `mlp`): the tower there is already cut to its feature layer. A text file
converted from the original checkpoint has no `<image>` in its vocabulary; its prompt is then
encoded in pieces around each image, as llama.cpp does around its media markers
(VisionConfig.split_at_placeholder).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine.execution.model.architectures.text.llama import LlamaForCausalLM
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

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile, ProjectorTensor

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


def checked_hf(cfg: Mapping[str, Any],
               strategies: tuple[str, ...]) -> tuple[dict[str, Any], TowerConfig, str]:
    """A LLaVA-style config.json's text config, its tower (cut to the feature layer) and its
    feature strategy, or UnsupportedModel saying what Ferry does not run."""
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
    if not isinstance(layer, int) or strategy not in strategies:
        raise UnsupportedModel(f"vision_feature_layer {layer!r} with strategy {strategy!r} is "
                               f"not supported (one layer; {', '.join(strategies)})")
    if str(cfg.get("projector_hidden_act", "gelu")) != "gelu":
        raise UnsupportedModel("projector_hidden_act must be gelu")
    return text, _tower(vision, layer), strategy


def image_token(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("image_token_index", cfg.get("image_token_id", 32000)))


def _processor(size: int, mean: tuple[float, float, float] | None = None,
               std: tuple[float, float, float] | None = None) -> ProcessorConfig:
    """CLIP's: the shorter side resized to the tower's size, a center crop to its square."""
    default = ProcessorConfig()
    return ProcessorConfig(shortest_edge=size, crop=(size, size), mean=mean or default.mean,
                           std=std or default.std)


class LlavaForConditionalGeneration(CausalLM):
    hf_model_types = ("llava",)
    projector_type = "mlp"
    projector_text_archs: ClassVar[tuple[str, ...]] = ("llama",)
    projector_names: ClassVar[Mapping[str, str]] = {
        f"mm.{i}.{part}": f"multi_modal_projector.linear_{n}.{part}"
        for i, n in ((0, 1), (2, 2)) for part in ("weight", "bias")}

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        text, tower, strategy = checked_hf(cfg, ("default", "full"))
        spec = VisionConfig(tower, image_token(cfg),
                            tower.num_patches + (strategy == "full"), "<image>",
                            _processor(tower.image_size))
        return with_vision(LlamaForCausalLM.config_from_hf(text), "llava", spec, cfg)

    @classmethod
    def projector_width(cls, projector: ProjectorFile) -> int | None:
        """The last linear layer's rows: the legacy script's projection_dim is the CLIP
        model's own projection (768 for ViT-L), which LLaVA never runs."""
        last = projector.tensors.get("mm.2.weight")
        return None if last is None else last.shape[0]

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        """The legacy scripts' file: its block_count is the layers the features come from
        (the last one dropped, or cut at `feature_layer`); the class token is dropped, as
        llama.cpp does for an `mlp` projector."""
        act = "gelu" if projector.meta.get("clip.use_gelu", False) else "quick_gelu"
        tower = projector.tower(act, True, CLIP_L.layer_norm_eps)
        layers = [int(x) for x in projector.get("feature_layer", [tower.layers])]
        if len(layers) != 1 or not 0 < layers[0] <= tower.layers:
            raise UnsupportedModel(f"{projector.path.name}: features from layers {layers} of "
                                   f"a {tower.layers}-layer tower are not supported (one "
                                   "layer)")
        if projector.tensors.get("mm.2.weight") is None or "mm.3.weight" in projector.tensors:
            raise UnsupportedModel(f"{projector.path.name}: an `mlp` projector of two linear "
                                   "layers (mm.0, mm.2) is supported, not this one")
        tower = replace(tower, layers=layers[0])
        mean, std = projector.mean_std()
        token = token_id("<image>")
        spec = VisionConfig(tower, 0 if token is None else token, tower.num_patches, "<image>",
                            _processor(tower.image_size, mean, std),
                            split_at_placeholder=token is None)
        return with_vision(text, "llava", spec, {})

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

    @classmethod
    def projector_tensors(cls, projector: ProjectorFile,
                          config: ModelConfig) -> dict[str, ProjectorTensor]:
        """The file's tensors under this model's keys, less the tower layers it holds past
        the feature layer (never run)."""
        keyed = super().projector_tensors(projector, config)
        assert config.vision is not None
        used = config.vision.vit.layers
        return {k: t for k, t in keyed.items()
                if not k.startswith("vision_tower.encoder.layers.")
                or int(k.split(".")[3]) < used}

    def skip_key(self, key: str) -> bool:
        """The tower's layers after the feature layer and its post-layernorm: never run."""
        if key.startswith("vision_tower.post_layernorm.") \
                or key == "vision_tower.embeddings.position_ids":
            return True
        if key.startswith("vision_tower.encoder.layers."):
            return int(key.split(".")[3]) >= int(self.config.vision.vit.layers)
        return super().skip_key(key)

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        features = yield from self.vision_tower.steps(pixels.to(self.dtype))
        if not self.keep_class_token:
            features = features[:, 1:]
        b, n, d = features.shape
        rows: torch.Tensor = self.multi_modal_projector(features.reshape(b * n, d))
        return rows.view(b, n, -1)

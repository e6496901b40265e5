"""SmolVLM (Idefics3): a SigLIP vision tower, a pixel-shuffle connector with one linear
projection, and a Llama text model with causal attention over every position.

An image is split into tiles plus a global image (engine.vision.tiling); each tile is one
encoder input and fills one run of `<image>` tokens in the prompt: (image_size / patch)^2 /
scale^2 of them (64 for SmolVLM2's 512-pixel tiles, patch 16, scale 4).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine.execution.model.architectures.text.llama import LlamaForCausalLM
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM
from engine.execution.model.encoder_steps import EncoderSteps
from engine.execution.model.vision import (
    PixelShuffleConnector,
    SiglipVisionTower,
    TowerConfig,
    VisionConfig,
    renamed,
    with_vision,
)
from engine.vision.tiling import TilingConfig

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile

# checkpoint prefixes (transformers 4 and 5 alike) -> this model's module names
RENAMES = (("model.text_model.", "model."), ("model.vision_model.", "vision_model."),
           ("model.connector.", "connector."))


# transformers' Idefics3VisionConfig defaults, where a checkpoint's vision_config is silent
SIGLIP = TowerConfig(hidden_size=1152, intermediate_size=3072, num_heads=16, layers=12,
                     image_size=224, patch_size=32, layer_norm_eps=1e-6,
                     hidden_act="gelu_pytorch_tanh", class_token=False)


IMAGE = "<image>"


def _vision(tower: TowerConfig, scale: int, image_token: int,
            tiling: TilingConfig) -> VisionConfig:
    side = tower.image_size // tower.patch_size
    if scale < 1 or side % scale:
        raise UnsupportedModel(f"scale_factor {scale} does not divide the tower's "
                               f"{side} x {side} patches")
    return VisionConfig(tower, image_token, (side // scale) ** 2, IMAGE, tiling)


class Idefics3ForConditionalGeneration(CausalLM):
    hf_model_types = ("idefics3",)
    projector_type = "idefics3"
    projector_text_archs = ("llama",)
    projector_tower = "vision_model"
    projector_names: ClassVar[Mapping[str, str]] = {
        "mm.model.fc.weight": "connector.modality_projection.proj.weight"}

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        text = dict(cfg.get("text_config") or {})
        if text.get("model_type", "llama") != "llama":
            raise UnsupportedModel(f"Idefics3 over a {text.get('model_type')!r} text model is "
                                   "not supported (supported: llama)")
        text.setdefault("model_type", "llama")
        tower = TowerConfig.from_hf(cfg.get("vision_config") or {}, SIGLIP)
        spec = _vision(tower, int(cfg.get("scale_factor", 2)),
                       int(cfg.get("image_token_id", 128257)),
                       TilingConfig(longest_edge=4 * tower.image_size, tile=tower.image_size))
        return with_vision(LlamaForCausalLM.config_from_hf(text), "idefics3", spec, cfg)

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        tower = projector.tower(SIGLIP.hidden_act, False, SIGLIP.layer_norm_eps)
        mean, std = projector.mean_std()
        longest = int(projector.get("preproc_image_size", 4 * tower.image_size))
        spec = _vision(tower, int(projector.get("projector.scale_factor", 2)),
                       projector.image_token(token_id, IMAGE),
                       TilingConfig(longest_edge=longest, tile=tower.image_size, mean=mean,
                                    std=std))
        return with_vision(text, "idefics3", spec, {})

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        spec: VisionConfig = cfg.vision
        tile = getattr(spec.processor, "tile", None)
        if tile != spec.vit.image_size:  # else a tile encodes to more rows than its tokens
            raise UnsupportedModel(f"the image processor's tiles ({tile} pixels) differ from "
                                   f"the vision tower's image_size ({spec.vit.image_size})")
        where = device if device is not None else "cpu"
        self.vision_model = SiglipVisionTower(spec.vit, dtype, where)
        side = spec.vit.image_size // spec.vit.patch_size
        scale = round((side * side / spec.tokens_per_image) ** 0.5)
        self.connector = PixelShuffleConnector(spec.vit.hidden_size, cfg.hidden_size, scale,
                                               dtype, where)

    @classmethod
    def hf_key(cls, key: str) -> str:
        return renamed(key, RENAMES)

    def skip_key(self, key: str) -> bool:
        return key == "vision_model.embeddings.position_ids" or super().skip_key(key)

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        """Tiles [B, 3, S, S] -> [B, tokens per tile, hidden]."""
        patches = yield from self.vision_model.steps(pixels.to(self.dtype))
        rows: torch.Tensor = self.connector(patches)
        return rows

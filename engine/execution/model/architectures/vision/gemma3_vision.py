"""Gemma 3 with images (4B, 12B, 27B): a SigLIP vision tower, its patches average-pooled to
256 tokens a picture (mm_tokens_per_image), and Gemma 3's text model.

Each image is one 896-pixel square (the processor resizes it, no crop) and sits in the
prompt as the processor writes it: "\\n\\n<start_of_image>", its image tokens,
"<end_of_image>\\n\\n", where the chat template wrote `<start_of_image>` for the image part.
An image's tokens attend to one another both ways (the text stays causal), so an image is
always computed within one prefill chunk (engine.vision.placement.chunk_end).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine.execution.model.architectures.text.gemma3 import Gemma3ForCausalLM
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.encoder_steps import EncoderSteps
from engine.execution.model.vision import (
    PooledProjector,
    SiglipVisionTower,
    TowerConfig,
    VisionConfig,
    renamed,
    with_vision,
)
from engine.vision import ProcessorConfig

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile

# checkpoint prefixes (transformers 5 and 4 layouts) -> this model's module names
RENAMES = (("model.language_model.", "model."), ("language_model.model.", "model."),
           ("language_model.lm_head.", "lm_head."),
           ("model.vision_tower.vision_model.", "vision_tower."),
           ("vision_tower.vision_model.", "vision_tower."),
           ("model.multi_modal_projector.", "multi_modal_projector."))

# Gemma 3's SigLIP (so400m at 896 pixels, patch 14), where a vision_config is silent
SIGLIP_896 = TowerConfig(hidden_size=1152, intermediate_size=4304, num_heads=16, layers=27,
                         image_size=896, patch_size=14, layer_norm_eps=1e-6,
                         hidden_act="gelu_pytorch_tanh", class_token=False)
# the tags around an image's tokens, as Gemma 3's tokenizer and chat template write them
START, END, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
IMAGE_TEXT = f"\n\n{START}{SOFT}{END}\n\n"  # SOFT once: repeated to the image's tokens


def _vision(text: ModelConfig, tower: TowerConfig, tokens: int, image_token: int,
            processor: ProcessorConfig) -> VisionConfig:
    per_side, side = round(tokens ** 0.5), tower.image_size // tower.patch_size
    if per_side * per_side != tokens or side % per_side:
        raise UnsupportedModel(f"{tokens} tokens an image do not pool the tower's "
                               f"{side} x {side} patches into a square")
    windows = [layer.window for layer in text.layers if layer.window]
    if windows and min(windows) < tokens:  # a local layer would see part of an image
        raise UnsupportedModel(f"a sliding window of {min(windows)} positions is shorter "
                               f"than an image's {tokens}")
    return VisionConfig(tower, image_token, tokens, START, processor, image_text=IMAGE_TEXT,
                        whole_images=True)


def processor_for(size: int) -> ProcessorConfig:
    """Gemma3ImageProcessor's steps, where a folder has no preprocessor_config.json: a
    bilinear resize to the tower's square (no crop), rescale, normalize around 0.5."""
    return ProcessorConfig(shortest_edge=None, size=(size, size), crop=None, resample=2,
                           mean=(0.5,) * 3, std=(0.5,) * 3)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    hf_model_types = ("gemma3",)
    gguf_archs: ClassVar[tuple[str, ...]] = ()  # a GGUF "gemma3" is the text model's
    projector_type = "gemma3"
    projector_text_archs = ("gemma3",)
    projector_names: ClassVar[Mapping[str, str]] = {
        "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
        # llama.cpp's converter stores Gemma's 1 + w, the multiplier the norm uses
        "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight"}

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        text = dict(cfg.get("text_config") or {})
        if text.get("model_type", "gemma3_text") != "gemma3_text":
            raise UnsupportedModel(f"Gemma 3 over a {text.get('model_type')!r} text model is "
                                   "not supported")
        vision = cfg.get("vision_config") or {}
        if vision.get("model_type", "siglip_vision_model") != "siglip_vision_model":
            raise UnsupportedModel(f"Gemma 3 with a {vision.get('model_type')!r} tower is not "
                                   "supported (supported: siglip_vision_model)")
        tower = TowerConfig.from_hf(vision, SIGLIP_896)
        text_model = Gemma3ForCausalLM.config_from_hf({"model_type": "gemma3_text", **text})
        spec = _vision(text_model, tower, int(cfg.get("mm_tokens_per_image", 256)),
                       int(cfg.get("image_token_index", 262144)),
                       processor_for(tower.image_size))
        return with_vision(text_model, "gemma3", spec, cfg)

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        tower = projector.tower(SIGLIP_896.hidden_act, False, SIGLIP_896.layer_norm_eps)
        side = tower.image_size // tower.patch_size
        scale = int(projector.get("projector.scale_factor", 4))  # written where not 4
        mean, std = projector.mean_std()
        processor = replace(processor_for(tower.image_size), mean=mean, std=std)
        spec = _vision(text, tower, (side // max(scale, 1)) ** 2,
                       projector.image_token(token_id, SOFT), processor)
        return with_vision(text, "gemma3", spec, {})

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        spec: VisionConfig = cfg.vision
        size = getattr(spec.processor, "output_size", None)
        if size != (spec.vit.image_size, spec.vit.image_size):
            raise UnsupportedModel(f"the image processor's {size} pixels differ from the "
                                   f"vision tower's {spec.vit.image_size}")
        where = device if device is not None else "cpu"
        self.vision_tower = SiglipVisionTower(spec.vit, dtype, where)
        tower = spec.vit
        self.multi_modal_projector = PooledProjector(
            tower.hidden_size, cfg.hidden_size, tower.image_size // tower.patch_size,
            round(spec.tokens_per_image ** 0.5), tower.layer_norm_eps, dtype, where)

    @classmethod
    def hf_key(cls, key: str) -> str:
        return renamed(key, RENAMES)

    def skip_key(self, key: str) -> bool:
        """The tower's pooling head (a SigLIP checkpoint may carry one): never run, as the
        projector takes every patch."""
        return key == "vision_tower.embeddings.position_ids" \
            or key.startswith("vision_tower.head.") or super().skip_key(key)

    def adapt_hf_tensor(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """Gemma's norms (1 + w) in the text model and the projector; the tower's are
        plain LayerNorms."""
        return tensor if key.startswith("vision_tower.") else super().adapt_hf_tensor(key,
                                                                                     tensor)

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        """Images [B, 3, S, S] -> [B, tokens per image, hidden]."""
        patches = yield from self.vision_tower.steps(pixels.to(self.dtype))
        rows: torch.Tensor = self.multi_modal_projector(patches)
        return rows

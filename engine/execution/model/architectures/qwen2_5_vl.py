"""Qwen2.5-VL: its own vision transformer (window attention, 2D rotary, 2 x 2 patches merged
into one position), over a Qwen2 text model whose rotary embedding is M-RoPE.

An image keeps its aspect ratio: the processor resizes it to a multiple of 28 pixels a side
(engine.vision.patches), so its positions are a grid of rows x cols that varies by image.
M-RoPE gives every position three components (time, row, column): text has the same number
in all three, an image's positions count its rows and columns from where it starts
(engine.vision.placement.mrope_positions). The chat template writes
`<|vision_start|><|image_pad|><|vision_end|>` for an image part; the one `<|image_pad|>` is
repeated to the image's positions.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from engine.execution.model.architectures.qwen2 import Qwen2ForCausalLM
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.vision import (
    QwenVisionTower,
    QwenViTConfig,
    VisionConfig,
    renamed,
    with_vision,
)
from engine.vision import PatchConfig

# checkpoint prefixes (transformers 5 and 4 layouts) -> this model's module names
RENAMES = (("model.language_model.", "model."), ("model.visual.", "visual."))
PAD = "<|image_pad|>"  # the image token; the template writes it once an image


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config.json fields: `text_config` (transformers 5) or the top
    level (4), with M-RoPE's rope written as the default rope plus its sections."""
    text = dict(cfg.get("text_config") or {k: v for k, v in cfg.items()
                                           if k != "vision_config"})
    rope = dict(text.pop("rope_parameters", None) or text.pop("rope_scaling", None) or {})
    text.pop("rope_scaling", None)
    kind = rope.pop("type", rope.get("rope_type", "default"))
    if kind not in ("mrope", "default"):
        raise UnsupportedModel(f"Qwen2.5-VL with rope_type {kind!r} is not supported")
    rope["rope_type"] = "default"
    sections = rope.get("mrope_section")
    if not sections or len(sections) != 3:
        raise UnsupportedModel("Qwen2.5-VL's rope needs its three mrope_section sizes")
    text["rope_parameters"] = rope
    text["model_type"] = "qwen2"
    return text


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    hf_model_types = ("qwen2_5_vl",)
    gguf_archs: ClassVar[tuple[str, ...]] = ()  # a GGUF "qwen2vl" is the text model's

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        tower = QwenViTConfig.from_hf(cfg.get("vision_config") or {})
        text = Qwen2ForCausalLM.config_from_hf(_text_config(cfg))
        if tower.out_hidden_size != text.hidden_size:
            raise UnsupportedModel(f"the vision tower's output ({tower.out_hidden_size}) is "
                                   f"not the text model's width ({text.hidden_size})")
        patches = PatchConfig(patch_size=tower.patch_size, merge_size=tower.spatial_merge_size,
                              temporal_patch_size=tower.temporal_patch_size)
        token = int(cfg.get("image_token_id", cfg.get("image_token_index", 151655)))
        # tokens_per_image 0: each image its own number of positions
        spec = VisionConfig(tower, token, 0, PAD, patches, image_text=PAD)
        return with_vision(text, "qwen2_5_vl", spec, cfg)

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        spec: VisionConfig = cfg.vision
        processor = spec.processor
        tower: QwenViTConfig = spec.tower  # type: ignore[assignment]
        if not isinstance(processor, PatchConfig) or (
                processor.patch_size, processor.merge_size, processor.temporal_patch_size) != (
                tower.patch_size, tower.spatial_merge_size, tower.temporal_patch_size):
            raise UnsupportedModel("the image processor's patches differ from the vision "
                                   "tower's")
        self.visual = QwenVisionTower(tower, dtype, device if device is not None else "cpu")

    @classmethod
    def hf_key(cls, key: str) -> str:
        return renamed(key, RENAMES)

    def encode_images(self, pixels: torch.Tensor,
                      grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Images of the same grid of positions [B, patches, 3 * 2 * 14 * 14], `grid` their
        (rows, cols) of positions -> [B, rows * cols, hidden]."""
        if grid is None:
            raise ValueError("a Qwen2.5-VL image needs its grid of positions")
        merge = self.config.vision.tower.spatial_merge_size
        patch_grid = (grid[0] * merge, grid[1] * merge)
        return torch.stack([self.visual(p.to(self.dtype), patch_grid) for p in pixels])

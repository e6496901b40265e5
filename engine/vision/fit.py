"""An image resized to fit a longest side, at about its own aspect (Pixtral's processor, as
Mistral 3 uses it): no crop, no tiles; both sides rounded up to whole merged positions.

The steps are transformers' PixtralImageProcessor's, in its order and arithmetic: RGB (alpha
over white), both sides scaled down by the same ratio where either is past the longest side
(rounded down), then each rounded up to a multiple of `unit`; a bicubic Pillow resize to
that; rescale and normalize as the CLIP processor does (processor.normalized)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.vision.processor import CLIP_MEAN, CLIP_STD, normalized, to_rgb, value_steps

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True, slots=True)
class FitConfig:
    longest_edge: int = 1540
    unit: int = 28  # pixels a merged position takes a side: patch 14 x merge 2
    resample: int = 3  # Pillow's filter number: 3 bicubic
    rescale: float | None = 1 / 255
    mean: tuple[float, float, float] | None = CLIP_MEAN
    std: tuple[float, float, float] | None = CLIP_STD

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any], unit: int = 28) -> FitConfig:
        """A PixtralImageProcessor's preprocessor_config.json; `unit` is the model's (its
        patch size there is the tower's, before merging)."""
        size = cfg.get("size") or {}
        longest = size.get("longest_edge") if isinstance(size, Mapping) else size
        if not cfg.get("do_resize", True) or longest is None:
            raise ValueError("Pixtral's processor needs size.longest_edge")
        return cls(longest_edge=int(longest), unit=unit, resample=int(cfg.get("resample", 3)),
                   **value_steps(cfg, CLIP_MEAN, CLIP_STD))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) a picture of this size is resized to."""
        ratio = max(height / self.longest_edge, width / self.longest_edge)
        if ratio > 1:
            height, width = int(height / ratio), int(width / ratio)  # both positive: floor
        # at least one position a side (a sliver of a picture; transformers' would be empty)
        return (max(1, -(-height // self.unit)) * self.unit,
                max(1, -(-width // self.unit)) * self.unit)

    def grid(self, pixels: torch.Tensor) -> tuple[int, int]:
        """The (rows, cols) of merged positions of pixel values [..., 3, H, W]."""
        return pixels.shape[-2] // self.unit, pixels.shape[-1] // self.unit


def fit(image: Image.Image, cfg: FitConfig) -> torch.Tensor:
    """One image -> pixel values [3, H, W] float32 on the CPU, H and W multiples of cfg.unit."""
    image = to_rgb(image)
    height, width = cfg.output_size(image.height, image.width)
    image = image.resize((width, height), resample=cfg.resample)
    pixels = np.moveaxis(np.asarray(image), -1, 0)  # [3, H, W] uint8
    return torch.from_numpy(normalized(pixels, cfg.rescale, cfg.mean, cfg.std))

"""Images as Qwen2-VL's (and Qwen2.5-VL's) vision tower reads them: flat patches, grouped by
the merger's 2x2 windows, with the grid of patches the rotary positions need.

The steps are its image processor's, in its order and arithmetic: alpha flattened onto white,
RGB; a Pillow resize (bicubic, or the configured filter) to both sides a multiple of
patch * merge, the pixel count kept within [min_pixels, max_pixels] (`smart_resize`); rescale
in float64 then float32; normalize in float32; the one frame repeated to the temporal patch;
then cut into patches, each merge window's patches next to each other. Same Pillow, same
numbers: the pixel values and the grid equal transformers' Qwen2-VL processor's (its Pillow
backend).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.vision.processor import CLIP_MEAN, CLIP_STD, normalized, to_rgb, value_steps

if TYPE_CHECKING:  # Pillow loads where a picture is read: ~2.5 MB a text server never uses
    from PIL import Image

MIN_PIXELS = 56 * 56  # the processor's default bounds on the resized image's pixel count
MAX_PIXELS = 28 * 28 * 1280
MAX_ASPECT = 200  # the processor refuses an image whose long side is over this times its short
# the names this one processor goes by across transformers' versions and backends (a config
# names it as saved; "Pil" is the backend whose numbers these are)
QWEN2_VL_TYPES = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast",
                  "Qwen2VLImageProcessorPil")
_FILTERS = (0, 1, 2, 3, 4, 5)  # Pillow's: nearest, Lanczos, bilinear, bicubic, box, Hamming


@dataclass(frozen=True, slots=True)
class PatchConfig:
    patch_size: int = 14  # a patch's side, in pixels
    merge_size: int = 2  # the merger joins merge x merge patches into one token
    temporal_patch_size: int = 2  # frames per patch: an image is its one frame repeated
    min_pixels: int = MIN_PIXELS  # the resized image's pixel count is within these
    max_pixels: int = MAX_PIXELS
    resample: int = 3  # Pillow's filter number: 3 bicubic
    rescale: float | None = 1 / 255
    mean: tuple[float, float, float] | None = CLIP_MEAN
    std: tuple[float, float, float] | None = CLIP_STD

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size", "min_pixels",
                     "max_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.resample not in _FILTERS:
            raise ValueError(f"resample {self.resample} is not one of Pillow's filters "
                             f"{_FILTERS}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std are both set or both None")

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> PatchConfig:
        """From a preprocessor_config.json: its top-level min_pixels / max_pixels override
        size's shortest_edge / longest_edge, as the processor's constructor does."""
        kind = cfg.get("image_processor_type")
        if kind is not None and kind not in QWEN2_VL_TYPES:
            raise ValueError(f"image_processor_type {kind!r} is not Qwen2-VL's "
                             f"({', '.join(QWEN2_VL_TYPES)})")
        if not cfg.get("do_resize", True):
            # without it the grid is whatever the input's size allows, or none at all
            raise ValueError("do_resize false is not supported: Qwen2-VL's patches need the "
                             "resize to multiples of patch_size * merge_size")
        size = cfg.get("size")
        if size is None:
            size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
        if not isinstance(size, Mapping):
            raise ValueError(f"size must be a mapping with shortest_edge and longest_edge, "
                             f"got {size!r}")
        # older configs name the bounds min_pixels / max_pixels inside size too
        low = _first(cfg.get("min_pixels"), size.get("shortest_edge"), size.get("min_pixels"))
        high = _first(cfg.get("max_pixels"), size.get("longest_edge"), size.get("max_pixels"))
        if low is None or high is None:
            raise ValueError(f"size must have shortest_edge and longest_edge (the pixel "
                             f"bounds), got {dict(size)}")
        return cls(
            patch_size=int(cfg.get("patch_size", 14)),
            merge_size=int(cfg.get("merge_size", 2)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", 2)),
            min_pixels=int(low),
            max_pixels=int(high),
            resample=int(cfg.get("resample", 3)), **value_steps(cfg, CLIP_MEAN, CLIP_STD))

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: whole merge windows of whole patches."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True, slots=True)
class Patches:
    # [rows * cols, 3 * temporal * patch * patch] float32 on the CPU: row-major over merge
    # windows, then row-major within each window
    pixels: torch.Tensor
    grid: tuple[int, int]  # (rows, cols) of patches; the processor's grid_thw is (1, rows, cols)
    merge: int  # the merge window's side, in patches

    @property
    def tokens(self) -> int:
        """The image's tokens in the prompt: one per merge window."""
        return self.grid[0] * self.grid[1] // self.merge ** 2

    @property
    def merged(self) -> tuple[int, int]:
        """(rows, cols) of merge windows: of the image's tokens."""
        return self.grid[0] // self.merge, self.grid[1] // self.merge


def _first(*values: Any) -> Any:
    """The first that is not None (a saved config may write a key as null)."""
    return next((v for v in values if v is not None), None)



def smart_resize(height: int, width: int, cfg: PatchConfig) -> tuple[int, int]:
    """(height, width) after the processor's resize: each side rounded to a multiple of
    `factor`; if the pixels then exceed max_pixels (or fall short of min_pixels), both sides
    scaled by one ratio first and rounded down (up)."""
    if min(height, width) < 1:
        raise ValueError(f"an image of {width}x{height} pixels is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"image of {width}x{height} pixels: its aspect ratio "
                         f"{max(height, width) / min(height, width):.1f} is over {MAX_ASPECT}, "
                         f"the most Qwen2-VL's processor takes")
    factor = cfg.factor
    # round(): Python's, half to even, as the processor's
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > cfg.max_pixels:
        beta = math.sqrt(height * width / cfg.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(image: Image.Image, cfg: PatchConfig) -> Patches:
    """One image -> its patches, normalized, and their grid."""
    image = to_rgb(image)
    height, width = smart_resize(image.height, image.width, cfg)
    image = image.resize((width, height), resample=cfg.resample)
    pixels = np.moveaxis(np.asarray(image), -1, 0)  # [3, H, W] uint8
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    rows, cols = height // p, width // p
    x = torch.from_numpy(normalized(pixels, cfg.rescale, cfg.mean, cfg.std))
    x = x.reshape(3, rows // m, m, p, cols // m, m, p)
    x = x.permute(1, 4, 2, 5, 0, 3, 6)  # [rows/m, cols/m, m, m, 3, p, p]
    # the frame repeated to the temporal patch, inside each patch: [..., 3, t, p, p]
    x = x.unsqueeze(5).expand(*x.shape[:5], t, p, p)
    return Patches(x.reshape(rows * cols, 3 * t * p * p).contiguous(), (rows, cols), m)

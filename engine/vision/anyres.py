"""Images as LLaVA 1.6 (LLaVA-NeXT) reads them, "anyres": the whole picture squeezed to one
tile, then the picture at a larger resolution cut into tiles.

The larger resolution is the one of the model's `image_grid_pinpoints` that keeps the most of
the picture's pixels and wastes the fewest (`best_resolution`); the picture is resized into
it keeping its aspect ratio, centered on black padding, and cut row by row into tiles of the
tower's size. Same Pillow resizes, padding and arithmetic as transformers' LlavaNext image
processor (its Pillow backend): equal pixel values.

After the tower, the tiles' feature grids are joined into one grid, the padding's features
are cut away again, and a learned newline row ends each row of it (`FeatureLayout`): so how
many positions a picture takes depends on its size, and the prompt holds that many.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.vision.processor import CLIP_MEAN, CLIP_STD, normalized, to_rgb, value_steps

if TYPE_CHECKING:  # Pillow loads where a picture is read: ~2.5 MB a text server never uses
    from PIL import Image

# (height, width) of the larger resolutions, LLaVA 1.6's where a config is silent
PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True, slots=True)
class AnyresConfig:
    pinpoints: tuple[tuple[int, int], ...] = PINPOINTS
    tile: int = 336  # a tile's side, and the whole picture's, in pixels
    resample: int = 3  # Pillow's filter number: 3 bicubic
    rescale: float | None = 1 / 255
    mean: tuple[float, float, float] | None = CLIP_MEAN
    std: tuple[float, float, float] | None = CLIP_STD

    def __post_init__(self) -> None:
        if not self.pinpoints:
            raise ValueError("image_grid_pinpoints is empty")
        for height, width in self.pinpoints:
            if height < self.tile or width < self.tile or height % self.tile \
                    or width % self.tile:
                raise ValueError(f"image_grid_pinpoints {height} x {width} is not a grid of "
                                 f"{self.tile}-pixel tiles")

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> AnyresConfig:
        """From a preprocessor_config.json. Ferry takes the common case: the whole picture
        resized to the crop's square, so that tiles and picture need no second resize."""
        size = cfg.get("size") or {}
        side = size.get("shortest_edge", size.get("height")) if isinstance(size, Mapping) \
            else size
        crop = cfg.get("crop_size") or {}
        tile = int(crop.get("height", side) if isinstance(crop, Mapping) else crop)
        if (side is not None and int(side) != tile) or (
                isinstance(crop, Mapping) and crop.get("width", tile) != tile):
            raise ValueError(f"a LLaVA-NeXT processor with size {size} and crop_size {crop} "
                             "is not supported (both one square)")
        return cls(
            pinpoints=pinpoints(cfg.get("image_grid_pinpoints") or PINPOINTS),
            tile=tile, resample=int(cfg.get("resample", 3)),
            **value_steps(cfg, CLIP_MEAN, CLIP_STD))


@dataclass(frozen=True, slots=True)
class AnyresImage:
    pixels: torch.Tensor  # [1 + rows * cols, 3, tile, tile] float32 on the CPU; whole first
    size: tuple[int, int]  # the picture's (height, width) as sent


@dataclass(frozen=True, slots=True)
class FeatureLayout:
    """Where a picture's features go: `rows` x `cols` tiles of side x side features each,
    joined into one grid of which rows [top, bottom) and columns [left, right) are kept (the
    rest is padding), each kept row followed by a newline."""

    side: int
    rows: int
    cols: int
    top: int
    bottom: int
    left: int
    right: int

    @property
    def length(self) -> int:
        """Positions the picture takes: the whole picture's tile, then the kept grid with a
        newline after each row."""
        return self.side * self.side + (self.bottom - self.top) * (self.right - self.left + 1)


def pinpoints(value: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(h), int(w)) for h, w in value)



def best_resolution(size: tuple[int, int],
                    choices: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The (height, width) of `choices` that keeps the most of a picture of `size`'s pixels
    once it is scaled into it, the fewest wasted where two keep as many; the first of equals."""
    height, width = size
    best, kept_most, wasted_least = choices[0], 0, math.inf
    for h, w in choices:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - kept
        if kept > kept_most or (kept == kept_most and wasted < wasted_least):
            best, kept_most, wasted_least = (h, w), kept, wasted
    return best


def _fitted(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The picture's (height, width) scaled into `target`, aspect kept, rounded up."""
    height, width = size
    th, tw = target
    if tw / width < th / height:
        return min(math.ceil(height * tw / width), th), tw
    return th, min(math.ceil(width * th / height), tw)


def split(image: Image.Image, cfg: AnyresConfig) -> AnyresImage:
    """One picture -> the whole picture as one tile, then its tiles row by row, normalized."""
    image = to_rgb(image)
    size = (image.height, image.width)
    target = best_resolution(size, cfg.pinpoints)
    height, width = _fitted(size, target)
    fitted = np.asarray(image.resize((width, height), resample=cfg.resample))
    canvas = np.zeros((*target, 3), np.uint8)  # black padding around the centered picture
    top, left = (target[0] - height) // 2, (target[1] - width) // 2
    canvas[top:top + height, left:left + width] = fitted
    t = cfg.tile
    frames = [np.asarray(image.resize((t, t), resample=cfg.resample))]
    frames += [canvas[r:r + t, c:c + t] for r in range(0, target[0], t)
               for c in range(0, target[1], t)]
    pixels = np.stack([np.moveaxis(f, -1, 0) for f in frames])  # [1 + tiles, 3, t, t] uint8
    return AnyresImage(torch.from_numpy(normalized(pixels, cfg.rescale, cfg.mean, cfg.std)),
                       size)


def layout(size: tuple[int, int], cfg: AnyresConfig, side: int) -> FeatureLayout:
    """The features of a picture of `size` whose tiles yield side x side features each: the
    tile grid, and the part of the joined grid the picture covers (its padding's rows or
    columns cut evenly from both ends, as transformers' LLaVA-NeXT unpads them)."""
    height, width = size
    target = best_resolution(size, cfg.pinpoints)
    rows, cols = target[0] // cfg.tile, target[1] // cfg.tile
    grid_h, grid_w = rows * side, cols * side
    top, bottom, left, right = 0, grid_h, 0, grid_w
    if width / height > grid_w / grid_h:
        kept = int(round(height * (grid_w / width), 7))
        top = (grid_h - kept) // 2
        bottom = grid_h - top
    else:
        kept = int(round(width * (grid_h / height), 7))
        left = (grid_w - kept) // 2
        right = grid_w - left
    return FeatureLayout(side, rows, cols, top, bottom, left, right)

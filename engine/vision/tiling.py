"""Image splitting as SmolVLM's (Idefics3's) image processor does it: resize so the longest
edge is `longest_edge`, round both sides up to whole tiles, cut the tiles row by row, and add
the whole image resized to one tile (the global image). A small image is one tile, alone.

Same Pillow resizes in the same order (the image stays uint8 between them), then rescale and
normalize as the other processors: the pixel values equal transformers' Idefics3 processor's
(its Pillow backend). `tile_text` writes the prompt text for one split image as its
processor does.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.vision.processor import normalized, to_rgb, value_steps

if TYPE_CHECKING:  # Pillow loads where a picture is read: ~2.5 MB a text server never uses
    from PIL import Image

MAX_IMAGE_SIZE = 4096  # the processor's absolute bound on either side after the resize
HALF = (0.5, 0.5, 0.5)


@dataclass(frozen=True, slots=True)
class TilingConfig:
    longest_edge: int | None = 4 * 364  # resize so the longer side is this (None: as it is)
    tile: int = 364  # a tile's side, and the global image's
    split: bool = True  # False: the whole image resized to one tile
    resample: int = 1  # Pillow's filter number: 1 Lanczos
    rescale: float | None = 1 / 255
    mean: tuple[float, float, float] | None = HALF
    std: tuple[float, float, float] | None = HALF

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> TilingConfig:
        size = cfg.get("size") or {}
        tile = cfg.get("max_image_size") or {}
        return cls(
            longest_edge=int(size["longest_edge"]) if cfg.get("do_resize", True)
            and isinstance(size, Mapping) and "longest_edge" in size else None,
            tile=int(tile.get("longest_edge", 364)) if isinstance(tile, Mapping) else int(tile),
            split=bool(cfg.get("do_image_splitting", True)),
            resample=int(cfg.get("resample", 1)), **value_steps(cfg, HALF, HALF))


@dataclass(frozen=True, slots=True)
class Tiles:
    pixels: torch.Tensor  # [tiles, 3, tile, tile] float32 on the CPU; the global image last
    rows: int  # 0 and 0: not split (one tile, the global image)
    cols: int



def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """The processor's resize to the longest edge: the other side truncated, then rounded up
    to even; then both bounded by MAX_IMAGE_SIZE."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _whole_tiles_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """Both sides rounded up to whole tiles, the shorter one from the aspect ratio."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def split(image: Image.Image, cfg: TilingConfig) -> Tiles:
    """One image -> its tiles and the global image, normalized."""
    image = to_rgb(image)
    if cfg.longest_edge is not None:
        height, width = _longest_edge_size(image.height, image.width, cfg.longest_edge)
        image = image.resize((width, height), resample=cfg.resample)
    rows = cols = 0
    if not cfg.split:
        frames = [image.resize((cfg.tile, cfg.tile), resample=cfg.resample)]
    else:
        height, width = _whole_tiles_size(image.height, image.width, cfg.tile)
        image = image.resize((width, height), resample=cfg.resample)
        frames = [image]
        if height > cfg.tile or width > cfg.tile:
            rows, cols = height // cfg.tile, width // cfg.tile
            frames = [image.crop((c * cfg.tile, r * cfg.tile, (c + 1) * cfg.tile,
                                  (r + 1) * cfg.tile)) for r in range(rows) for c in range(cols)]
            frames.append(image.resize((cfg.tile, cfg.tile), resample=cfg.resample))
    pixels = np.stack([np.moveaxis(np.asarray(f), -1, 0) for f in frames])  # [T, 3, S, S]
    return Tiles(torch.from_numpy(normalized(pixels, cfg.rescale, cfg.mean, cfg.std)),
                 rows, cols)


def tile_text(rows: int, cols: int, tokens_per_tile: int, image: str = "<image>",
              around: str = "<fake_token_around_image>", whole: str = "<global-img>") -> str:
    """The text standing for one image in the prompt, as Idefics3's processor writes it:
    each tile's `<row_r_col_c>` and image tokens, a newline after each row, then the global
    image's."""
    tokens = image * tokens_per_tile
    glob = f"{around}{whole}{tokens}{around}"
    if rows == 0 and cols == 0:
        return glob
    grid = "".join("".join(f"{around}<row_{r + 1}_col_{c + 1}>{tokens}" for c in range(cols))
                   + "\n" for r in range(rows))
    return f"{grid}\n{glob}"

"""An image processor's numbers, as the Hugging Face CLIP and SigLIP processors compute them.

Read from a model folder's preprocessor_config.json. The steps are theirs, in their order and
arithmetic: alpha flattened onto white, RGB; a bicubic (or the configured) Pillow resize, to
the shortest edge or to a fixed size; a center crop; rescale in float64 then float32; then
normalize in float32. Same Pillow, same numbers: the pixel values equal the processor's.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # Pillow loads where a picture is read: ~2.5 MB a text server never uses
    from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class ProcessorConfig:
    shortest_edge: int | None = 224  # resize so the shorter side is this (CLIP)
    size: tuple[int, int] | None = None  # or to (height, width) exactly (SigLIP)
    crop: tuple[int, int] | None = (224, 224)  # center crop to (height, width)
    resample: int = 3  # Pillow's filter number: 3 bicubic, 2 bilinear
    rescale: float | None = 1 / 255
    mean: tuple[float, float, float] | None = CLIP_MEAN
    std: tuple[float, float, float] | None = CLIP_STD

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> ProcessorConfig:
        if cfg.get("do_pan_and_scan"):
            raise ValueError("do_pan_and_scan (Gemma 3's extra crops of a wide image) is not "
                             "supported")
        size = cfg.get("size") or {}
        if not isinstance(size, Mapping):  # an int: a square
            size = {"height": int(size), "width": int(size)}
        shortest = size.get("shortest_edge")
        exact = (int(size["height"]), int(size["width"])) \
            if "height" in size and "width" in size else None
        crop = cfg.get("crop_size") or {}
        if not isinstance(crop, Mapping):
            crop = {"height": int(crop), "width": int(crop)}
        return cls(
            shortest_edge=int(shortest) if cfg.get("do_resize", True) and shortest else None,
            size=exact if cfg.get("do_resize", True) and not shortest else None,
            crop=(int(crop["height"]), int(crop["width"]))
            if cfg.get("do_center_crop", False) and crop else None,
            resample=int(cfg.get("resample", 3)), **value_steps(cfg, None, None))

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every output, where it does not depend on the input."""
        return self.crop or self.size


def value_steps(cfg: Mapping[str, Any], mean: tuple[float, float, float] | None,
                std: tuple[float, float, float] | None) -> dict[str, Any]:
    """`rescale`, `mean` and `std` as a preprocessor_config.json sets them (None where it
    turns the step off); `mean` and `std` where it names none."""
    normalize = cfg.get("do_normalize", True)
    return {"rescale": float(cfg.get("rescale_factor", 1 / 255))
            if cfg.get("do_rescale", True) else None,
            "mean": _triple(cfg.get("image_mean", mean), "image_mean") if normalize else None,
            "std": _triple(cfg.get("image_std", std), "image_std") if normalize else None}


def _triple(value: Any, name: str) -> tuple[float, float, float] | None:
    """One value per channel (RGB); a single number for all three."""
    if value is None:
        return None
    values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)] * 3
    if len(values) != 3:
        raise ValueError(f"{name} must have 3 values (RGB), got {len(values)}")
    return values[0], values[1], values[2]


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB; transparent pixels over white, as the Hugging Face processors flatten them."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def preprocess(image: Image.Image, cfg: ProcessorConfig) -> torch.Tensor:
    """One image -> pixel values [3, height, width], float32 on the CPU."""
    image = to_rgb(image)
    if cfg.shortest_edge is not None:
        width, height = image.size
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = cfg.shortest_edge, int(cfg.shortest_edge * long / short)
        size = (new_short, new_long) if width <= height else (new_long, new_short)
        image = image.resize(size, resample=cfg.resample)
    elif cfg.size is not None:
        image = image.resize((cfg.size[1], cfg.size[0]), resample=cfg.resample)
    pixels = np.moveaxis(np.asarray(image), -1, 0)  # [3, H, W] uint8
    if cfg.crop is not None:
        pixels = _center_crop(pixels, cfg.crop)
    return torch.from_numpy(normalized(pixels, cfg.rescale, cfg.mean, cfg.std))


def normalized(pixels: np.ndarray, rescale: float | None,
               mean: tuple[float, float, float] | None,
               std: tuple[float, float, float] | None) -> np.ndarray:
    """uint8 pixels [..., 3, H, W] -> float32, as the Hugging Face processors compute it:
    rescaled in float64, then normalized per channel in float32."""
    values = pixels.astype(np.float64) * rescale if rescale is not None \
        else pixels.astype(np.float64)
    out = values.astype(np.float32)
    if mean is not None and std is not None:
        out = (out - np.array(mean, dtype=np.float32)[:, None, None]) \
            / np.array(std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray(out)


def _center_crop(pixels: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """transformers' center_crop: offsets rounded down; a side shorter than the crop is padded
    with zeros around the image first."""
    _, height, width = pixels.shape
    ch, cw = crop
    if height < ch or width < cw:
        padded = np.zeros((pixels.shape[0], max(ch, height), max(cw, width)), pixels.dtype)
        top, left = -(-(padded.shape[1] - height) // 2), -(-(padded.shape[2] - width) // 2)
        padded[:, top:top + height, left:left + width] = pixels
        pixels, height, width = padded, padded.shape[1], padded.shape[2]
    top, left = (height - ch) // 2, (width - cw) // 2
    return pixels[:, top:top + ch, left:left + cw]

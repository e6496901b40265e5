"""Image inputs: decoding a request's images, the processor's pixel values, and where each
image sits in its prompt. Pillow and torch only; no model here (the vision towers are in
engine.execution.model.vision).

Where images sit (placement) imports at once and needs no torch: the scheduler and the
simulator use it. Decoding and preprocessing load Pillow and torch on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_getattr
from engine.vision.placement import (
    ImageInput,
    cache_ids,
    chunk_end,
    expand,
    mrope_positions,
    runs,
    tile_digest,
)

if TYPE_CHECKING:
    from engine.vision.anyres import AnyresConfig, AnyresImage, FeatureLayout
    from engine.vision.anyres import layout as anyres_layout
    from engine.vision.anyres import split as split_anyres
    from engine.vision.decode import DecodedImage, ImageError, data_url_bytes
    from engine.vision.decode import decode as decode_image
    from engine.vision.fit import FitConfig
    from engine.vision.fit import fit as fit_image
    from engine.vision.patches import PatchConfig, Patches, patchify, smart_resize
    from engine.vision.processor import ProcessorConfig, preprocess
    from engine.vision.tiling import Tiles, TilingConfig, tile_text
    from engine.vision.tiling import split as split_image

_LAZY: dict[str, str] = {
    "AnyresConfig": "engine.vision.anyres:AnyresConfig",
    "AnyresImage": "engine.vision.anyres:AnyresImage",
    "FeatureLayout": "engine.vision.anyres:FeatureLayout",
    "anyres_layout": "engine.vision.anyres:layout",
    "split_anyres": "engine.vision.anyres:split",
    "DecodedImage": "engine.vision.decode:DecodedImage",
    "ImageError": "engine.vision.decode:ImageError",
    "data_url_bytes": "engine.vision.decode:data_url_bytes",
    # not `decode`: that name is the submodule's once it is imported
    "decode_image": "engine.vision.decode:decode",
    "FitConfig": "engine.vision.fit:FitConfig",
    "fit_image": "engine.vision.fit:fit",
    "PatchConfig": "engine.vision.patches:PatchConfig",
    "Patches": "engine.vision.patches:Patches",
    "patchify": "engine.vision.patches:patchify",
    "smart_resize": "engine.vision.patches:smart_resize",
    "ProcessorConfig": "engine.vision.processor:ProcessorConfig",
    "preprocess": "engine.vision.processor:preprocess",
    "TilingConfig": "engine.vision.tiling:TilingConfig",
    "Tiles": "engine.vision.tiling:Tiles",
    # not `split` / `tiling`: names a caller would read as the submodule's
    "split_image": "engine.vision.tiling:split",
    "tile_text": "engine.vision.tiling:tile_text",
}

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = [
    "AnyresConfig",
    "AnyresImage",
    "DecodedImage",
    "FeatureLayout",
    "FitConfig",
    "ImageError",
    "ImageInput",
    "PatchConfig",
    "Patches",
    "ProcessorConfig",
    "Tiles",
    "TilingConfig",
    "anyres_layout",
    "cache_ids",
    "chunk_end",
    "data_url_bytes",
    "decode_image",
    "expand",
    "fit_image",
    "mrope_positions",
    "patchify",
    "preprocess",
    "runs",
    "smart_resize",
    "split_anyres",
    "split_image",
    "tile_digest",
    "tile_text",
]

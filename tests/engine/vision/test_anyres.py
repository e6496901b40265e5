"""LLaVA-NeXT's "anyres" images against transformers' LlavaNext image processor (its Pillow
backend, built offline): the same resolution chosen, equal pixel values for wide, tall,
small and square pictures; and the positions a picture takes equal to LlavaNextProcessor's
count, for the same pictures and a range of sizes."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from engine.vision.anyres import AnyresConfig, best_resolution, layout, split
from tests.tools.tiny_llava import picture

PINPOINTS = [[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]


def _hf() -> Any:
    from transformers import LlavaNextImageProcessorPil

    return LlavaNextImageProcessorPil(size={"shortest_edge": 32},
                                      crop_size={"height": 32, "width": 32},
                                      image_grid_pinpoints=PINPOINTS)


@pytest.mark.parametrize("size,mode", [((50, 40), "RGB"), ((120, 30), "RGB"),
                                       ((23, 77), "RGBA"), ((64, 64), "RGB"), ((9, 7), "RGB"),
                                       ((300, 299), "RGB")])
def test_pixels_equal_the_hf_processor(size: tuple[int, int], mode: str) -> None:
    hf = _hf()
    image = picture(size, mode)
    got = split(image, AnyresConfig.from_json(hf.to_dict()))
    want = hf(image, return_tensors="np")
    assert got.size == tuple(int(v) for v in want["image_sizes"][0]) == (size[1], size[0])
    assert torch.equal(got.pixels, torch.from_numpy(np.asarray(want["pixel_values"][0])))


def test_best_resolution_equals_transformers() -> None:
    from transformers.image_processing_utils import select_best_resolution

    choices = [tuple(p) for p in PINPOINTS]
    for height in range(1, 200, 7):
        for width in range(1, 200, 11):
            assert best_resolution((height, width), choices) == \
                select_best_resolution((height, width), PINPOINTS)


def test_positions_equal_the_hf_processor_count() -> None:
    """LlavaNextProcessor's count of `<image>` tokens for a picture (the model's features:
    the whole picture, the unpadded grid, a newline a row), for many sizes and two
    resolutions of features per tile."""
    from transformers import LlavaNextProcessor

    hf = _hf()
    cfg = AnyresConfig.from_json(hf.to_dict())
    for patch in (8, 4):
        processor: Any = LlavaNextProcessor.__new__(LlavaNextProcessor)
        processor.image_processor, processor.patch_size = hf, patch
        processor.num_additional_image_tokens = 1
        for height in range(3, 260, 13):
            for width in range(3, 260, 17):
                want = processor._get_number_of_features(height, width, 32, 32) - 1
                assert layout((height, width), cfg, 32 // patch).length == want, (height, width)


def test_a_vga_picture_at_llava_1_6_tiles() -> None:
    """docs/vision.md's example: 640 x 480 at LLaVA 1.6's pinpoints and 336-pixel tiles."""
    at = layout((480, 640), AnyresConfig(), 24)
    assert (at.rows, at.cols, at.top, at.bottom, at.left, at.right) == (2, 2, 6, 42, 0, 48)
    assert at.length == 576 + 36 * 49 == 2340


def test_a_processor_with_two_sizes_is_refused() -> None:
    with pytest.raises(ValueError, match="not supported"):
        AnyresConfig.from_json({"size": {"shortest_edge": 336},
                                "crop_size": {"height": 224, "width": 224}})
    with pytest.raises(ValueError, match="not a grid"):
        AnyresConfig(pinpoints=((336, 500),))

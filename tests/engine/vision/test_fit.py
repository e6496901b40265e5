"""Mistral 3's pictures at about their own aspect against transformers' Pixtral image
processor (its Pillow backend, built offline, given the merged patch as PixtralProcessor gives
it): equal sizes and pixel values for pictures that fit, that are scaled down, transparent
ones and slivers."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.vision.fit import FitConfig, fit
from tests.tools.tiny_llava import picture

LONGEST, UNIT = 112, 28  # patch 14, merged 2 x 2


def _hf() -> Any:
    from transformers import PixtralImageProcessorPil

    return PixtralImageProcessorPil(size={"longest_edge": LONGEST},
                                    patch_size={"height": 14, "width": 14})


@pytest.mark.parametrize("size,mode", [((50, 40), "RGB"), ((112, 112), "RGB"),
                                       ((640, 480), "RGB"), ((23, 377), "RGBA"),
                                       ((1000, 30), "RGB"), ((9, 7), "RGB")])
def test_pixels_equal_the_hf_processor(size: tuple[int, int], mode: str) -> None:
    hf = _hf()
    image = picture(size, mode)
    cfg = FitConfig.from_json(hf.to_dict(), unit=UNIT)
    got = fit(image, cfg)
    want = hf(images=[image], patch_size={"height": UNIT, "width": UNIT},
              return_tensors="pt")
    height, width = (int(v) for v in want["image_sizes"][0])
    assert tuple(got.shape) == (3, height, width)
    assert got.shape[1] % UNIT == 0 and got.shape[2] % UNIT == 0
    torch.testing.assert_close(got, want["pixel_values"][0, :, :height, :width],
                               atol=0, rtol=0)


def test_the_grid_counts_merged_positions() -> None:
    cfg = FitConfig(longest_edge=LONGEST, unit=UNIT)
    assert cfg.output_size(480, 640) == (84, 112)  # scaled by 640 / 112, then whole units
    assert cfg.grid(torch.zeros(3, 84, 112)) == (3, 4)
    assert cfg.output_size(1, 500) == (28, 112)  # a sliver keeps one row


def test_a_processor_without_a_longest_side_is_refused() -> None:
    with pytest.raises(ValueError, match="longest_edge"):
        FitConfig.from_json({"size": {"height": 10, "width": 10}})

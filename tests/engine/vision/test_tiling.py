"""SmolVLM's image splitting against transformers' Idefics3 image processor (its Pillow
backend, built offline): the same tiles, rows and columns, and equal pixel values, for small
images (one tile), wide and tall ones (split), and without splitting; and the prompt text
equal to Idefics3's processor's."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from engine.vision.tiling import TilingConfig, split, tile_text


def _image(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    channels = {"RGB": 3, "RGBA": 4}[mode]
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8),
                           mode)


def _hf(**kwargs: Any) -> Any:
    from transformers import Idefics3ImageProcessorPil

    return Idefics3ImageProcessorPil(size={"longest_edge": 96},
                                     max_image_size={"longest_edge": 32}, **kwargs)


@pytest.mark.parametrize("size,mode", [((20, 14), "RGB"), ((53, 37), "RGB"), ((37, 90), "RGBA"),
                                       ((200, 61), "RGB"), ((64, 64), "RGB"), ((31, 33), "RGB")])
@pytest.mark.parametrize("splitting", [True, False])
def test_tiles_equal_the_hf_processor(size: tuple[int, int], mode: str, splitting: bool) -> None:
    hf = _hf(do_image_splitting=splitting)
    image = _image(size, mode)
    got = split(image, TilingConfig.from_json(hf.to_dict()))
    want = hf(image, return_tensors="np", return_row_col_info=True)
    assert (got.rows, got.cols) == (want["rows"][0][0], want["cols"][0][0])
    assert torch.equal(got.pixels, torch.from_numpy(np.asarray(want["pixel_values"][0])))


def test_a_large_image_is_split() -> None:
    got = split(_image((200, 61)), TilingConfig.from_json(_hf().to_dict()))
    assert (got.rows, got.cols) == (1, 3) and got.pixels.shape == (4, 3, 32, 32)


def test_the_prompt_text_equals_the_hf_processor() -> None:
    from transformers import Idefics3Processor

    hf = _hf()
    image = _image((200, 61))
    got = split(image, TilingConfig.from_json(hf.to_dict()))
    processor: Any = Idefics3Processor.__new__(Idefics3Processor)
    processor.fake_image_token, processor.image_token = "<fake_token_around_image>", "<image>"
    processor.global_image_tag, processor.image_seq_len = "<global-img>", 4
    info = {"rows": [[got.rows]], "cols": [[got.cols]]}
    assert tile_text(got.rows, got.cols, 4) == processor.replace_image_token(info, 0)
    small = {"rows": [[0]], "cols": [[0]]}
    assert tile_text(0, 0, 4) == processor.replace_image_token(small, 0)


def test_config_reads_a_smolvlm_preprocessor_config() -> None:
    cfg = TilingConfig.from_json({"do_image_splitting": True, "resample": 1,
                                  "max_image_size": {"longest_edge": 512},
                                  "size": {"longest_edge": 2048},
                                  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
    assert (cfg.longest_edge, cfg.tile, cfg.split, cfg.resample) == (2048, 512, True, 1)

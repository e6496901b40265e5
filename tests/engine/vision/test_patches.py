"""Qwen2-VL's patches against transformers' Qwen2-VL image processor (its Pillow backend,
built offline): the same grid and equal pixel values for an image below min_pixels, odd sizes,
a wide one, one above max_pixels and a transparent one; its preprocessor_config.json read in
both of its forms; and the images it refuses refused."""
from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from engine.vision import PatchConfig, Patches, patchify, smart_resize

QWEN25_VL_CONFIG = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}


def _image(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    channels = {"RGB": 3, "RGBA": 4}[mode]
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8),
                           mode)


def _transparent_png(size: tuple[int, int]) -> Image.Image:
    """An RGBA PNG, read back: alpha from clear through half to opaque."""
    image = _image(size, "RGBA")
    alpha = np.asarray(image)[..., 3].copy()
    alpha[: size[1] // 3] = 0
    alpha[size[1] // 3: 2 * size[1] // 3] = 128
    image.putalpha(Image.fromarray(alpha, "L"))
    out = io.BytesIO()
    image.save(out, "PNG")
    return Image.open(io.BytesIO(out.getvalue()))


def _hf(**kwargs: Any) -> Any:
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**kwargs)


def _assert_equal(got: Patches, want: Any) -> None:
    pixels = torch.from_numpy(np.asarray(want["pixel_values"]))
    assert [1, *got.grid] == want["image_grid_thw"].tolist()[0]
    assert got.pixels.dtype == torch.float32 and got.pixels.shape == pixels.shape
    assert torch.equal(got.pixels, pixels)


@pytest.mark.parametrize("size,mode,kwargs", [
    ((20, 30), "RGB", {}),  # below min_pixels: scaled up
    ((97, 61), "RGB", {}),
    ((61, 97), "RGB", {}),
    ((300, 40), "RGB", {}),  # wide
    ((130, 171), "RGB", {"max_pixels": 56 * 56}),  # above max_pixels: scaled down
    ((33, 45), "RGB", {"do_rescale": False, "do_normalize": False}),
    ((45, 33), "RGB", {"patch_size": 16, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                       "resample": 2}),  # Qwen3-VL's patches, bilinear
    ((40, 50), "RGB", {"temporal_patch_size": 3, "merge_size": 1}),
])
def test_patches_equal_the_hf_processor(size: tuple[int, int], mode: str,
                                        kwargs: dict[str, Any]) -> None:
    hf = _hf(**kwargs)
    image = _image(size, mode)
    _assert_equal(patchify(image, PatchConfig.from_json(hf.to_dict())),
                  hf(image, return_tensors="np"))


def test_transparent_png_equals_the_hf_processor() -> None:
    hf = _hf()
    image = _transparent_png((71, 59))
    got = patchify(image, PatchConfig.from_json(hf.to_dict()))
    _assert_equal(got, hf(image, return_tensors="np"))
    # the clear top third is white: (1 - mean) / std in every channel
    white = (1 - np.array(QWEN25_VL_CONFIG["image_mean"], np.float32)) \
        / np.array(QWEN25_VL_CONFIG["image_std"], np.float32)
    first = got.pixels[0].reshape(3, 2, 14, 14)  # [C, T, p, p]
    assert torch.equal(first, torch.from_numpy(white)[:, None, None, None].expand(3, 2, 14, 14))


def test_the_defaults_are_the_hf_processors() -> None:
    assert PatchConfig.from_json(_hf().to_dict()) == PatchConfig()
    assert PatchConfig.from_json({}) == PatchConfig()
    assert PatchConfig().factor == 28


def test_qwen25_vl_config_round_trips() -> None:
    config = PatchConfig.from_json(QWEN25_VL_CONFIG)
    assert config == PatchConfig(min_pixels=3136, max_pixels=12845056)
    hf = _hf(**{k: v for k, v in QWEN25_VL_CONFIG.items()
                if k not in ("image_processor_type", "processor_class")})
    assert PatchConfig.from_json(hf.to_dict()) == config  # size: shortest_/longest_edge
    image = _image((500, 380))
    _assert_equal(patchify(image, config), hf(image, return_tensors="np"))


def test_size_form_and_overrides() -> None:
    sized = {"size": {"shortest_edge": 1000, "longest_edge": 20000}}
    assert PatchConfig.from_json(sized) == PatchConfig(min_pixels=1000, max_pixels=20000)
    # top-level min_pixels / max_pixels win over size, as in the processor's constructor
    assert PatchConfig.from_json({**sized, "min_pixels": 500}) \
        == PatchConfig(min_pixels=500, max_pixels=20000)
    legacy = {"size": {"min_pixels": 700, "max_pixels": 9000}}
    assert PatchConfig.from_json(legacy) == PatchConfig(min_pixels=700, max_pixels=9000)
    plain = PatchConfig.from_json({"do_rescale": False, "do_normalize": False})
    assert plain.rescale is None and plain.mean is None and plain.std is None


@pytest.mark.parametrize("cfg,match", [
    ({"do_resize": False}, "do_resize"),
    ({"size": {"longest_edge": 20000}}, "shortest_edge"),
    ({"size": 224}, "size"),
    ({"min_pixels": 0}, "min_pixels"),
    ({"patch_size": 0}, "patch_size"),
    ({"resample": 9}, "resample"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
    ({"image_processor_type": "SiglipImageProcessor"}, "image_processor_type"),
])
def test_configs_it_cannot_honour_are_refused(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PatchConfig.from_json(cfg)


@pytest.mark.parametrize("height,width,config", [
    (30, 20, PatchConfig()), (61, 97, PatchConfig()), (40, 300, PatchConfig()),
    (171, 130, PatchConfig(max_pixels=56 * 56)), (1080, 1920, PatchConfig()),
    (3000, 4000, PatchConfig(min_pixels=3136, max_pixels=12845056)), (14, 2800, PatchConfig()),
    (42, 42, PatchConfig()), (70, 70, PatchConfig()),  # half a factor over: round half to even
])
def test_smart_resize_equals_the_hf_function(height: int, width: int,
                                             config: PatchConfig) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as hf_smart_resize,
    )

    got = smart_resize(height, width, config)
    assert got == hf_smart_resize(height, width, config.factor, config.min_pixels,
                                  config.max_pixels)
    assert got[0] % config.factor == 0 and got[1] % config.factor == 0


def test_aspect_ratio_over_200_is_refused() -> None:
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2010, PatchConfig())
    with pytest.raises(ValueError, match="aspect ratio"):
        patchify(_image((3, 700)), PatchConfig())
    assert smart_resize(10, 2000, PatchConfig()) == (28, 812)  # exactly 200 is taken


def test_patch_layout_groups_merge_windows() -> None:
    """Patch i is the merge window i // 4's patch i % 4, row-major; its values are the frame's,
    repeated over time."""
    image = _image((28, 56))  # 4 x 2 patches, 2 x 1 merge windows, unchanged by the resize
    config = PatchConfig(min_pixels=1, rescale=None, mean=None, std=None)
    got = patchify(image, config)
    assert got.grid == (4, 2) and got.merged == (2, 1) and got.tokens == 2
    frame = torch.from_numpy(np.moveaxis(np.asarray(image), -1, 0).astype(np.float32))
    for i in range(8):
        window, inner = divmod(i, 4)
        row, col = window * 2 + inner // 2, inner % 2
        want = frame[:, row * 14:(row + 1) * 14, col * 14:(col + 1) * 14]
        patch = got.pixels[i].reshape(3, 2, 14, 14)
        assert torch.equal(patch[:, 0], want) and torch.equal(patch[:, 1], want)
    assert math.prod(got.pixels.shape) == 3 * 28 * 56 * 2

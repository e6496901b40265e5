"""Image decoding and preprocessing against transformers' own image processors (their Pillow
backends, built offline from a config): the pixel values must be equal, for every format a
request can carry."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from engine.vision import ImageError, ProcessorConfig, data_url_bytes, decode_image, preprocess


def _encoded(fmt: str, mode: str = "RGB", size: tuple[int, int] = (53, 37)) -> bytes:
    rng = np.random.default_rng(len(fmt))
    channels = {"RGB": 3, "RGBA": 4}[mode]
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8),
                            mode)
    out = io.BytesIO()
    if fmt == "GIF":  # two frames: the first is read
        other = Image.new("RGB", size, (255, 0, 0))
        image.save(out, "GIF", save_all=True, append_images=[other])
    else:
        image.save(out, fmt)
    return out.getvalue()


def _processors() -> list[object]:
    from transformers import (
        CLIPImageProcessorPil,
        Gemma3ImageProcessorPil,
        SiglipImageProcessorPil,
    )

    return [CLIPImageProcessorPil(size={"shortest_edge": 32},
                                  crop_size={"height": 32, "width": 32}),
            SiglipImageProcessorPil(size={"height": 24, "width": 24}),
            Gemma3ImageProcessorPil(size={"height": 40, "width": 40})]


@pytest.mark.parametrize("fmt,mode", [("PNG", "RGB"), ("PNG", "RGBA"), ("JPEG", "RGB"),
                                      ("WEBP", "RGB"), ("GIF", "RGB")])
def test_pixels_equal_the_hf_processors(fmt: str, mode: str) -> None:
    data = _encoded(fmt, mode)
    for hf in _processors():
        config = ProcessorConfig.from_json(hf.to_dict())  # type: ignore[attr-defined]
        got = preprocess(decode_image(data, 10_000).image, config)
        want = hf(Image.open(io.BytesIO(data)), return_tensors="np")  # type: ignore[operator]
        assert torch.equal(got, torch.from_numpy(np.asarray(want["pixel_values"][0])))


def test_gemma3_family_defaults_equal_its_processor() -> None:
    """Without a preprocessor_config.json, Gemma 3's pixels are still its processor's."""
    from transformers import Gemma3ImageProcessorPil

    from engine.execution.model.architectures.vision.gemma3_vision import processor_for

    hf = Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    config = processor_for(896)
    assert ProcessorConfig.from_json(hf.to_dict()) == config
    data = _encoded("PNG")
    want = hf(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    assert torch.equal(preprocess(decode_image(data, 10_000).image, config),
                       torch.from_numpy(np.asarray(want)))


def test_pan_and_scan_is_refused() -> None:
    with pytest.raises(ValueError, match="pan_and_scan"):
        ProcessorConfig.from_json({"size": {"height": 896, "width": 896},
                                   "do_pan_and_scan": True})


def test_gif_first_frame_is_read() -> None:
    image = decode_image(_encoded("GIF"), 10_000).image
    assert image.convert("RGB").getpixel((0, 0)) != (255, 0, 0)


def test_bad_images_are_refused_with_a_code() -> None:
    with pytest.raises(ImageError) as exc:
        decode_image(b"hello, not an image", 10_000)
    assert exc.value.code == "invalid_image"
    with pytest.raises(ImageError) as exc:
        decode_image(_encoded("PNG", size=(200, 100)), 10_000)
    assert exc.value.code == "image_too_large" and "20000" in str(exc.value)
    with pytest.raises(ImageError) as exc:
        data_url_bytes("https://example.com/cat.png")
    assert exc.value.code == "invalid_image_url"
    with pytest.raises(ImageError) as exc:
        data_url_bytes("data:image/png;base64,@@@")
    assert exc.value.code == "invalid_image"
    ok = "data:image/png;base64," + base64.b64encode(_encoded("PNG")).decode()
    assert decode_image(data_url_bytes(ok), 10_000).image.size == (53, 37)


def test_truncated_image_is_refused() -> None:
    data = _encoded("PNG")[:200]
    with pytest.raises(ImageError) as exc:
        decode_image(data, 10_000)
    assert exc.value.code == "invalid_image"

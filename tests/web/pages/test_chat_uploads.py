"""An attached file is checked by its own bytes: PNG, JPEG, WebP and GIF are taken (the GIF's
first frame thumbnailed, a photo's EXIF turn applied), anything else is a 400 naming it,
too many pixels a 413; the thumbnail keeps transparency as PNG, else is a JPEG."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from web.config import WebConfig
from web.pages.chat.rules import ChatError
from web.pages.chat.uploads import THUMB_SIDE, checked_image, checked_images

PIXELS = WebConfig(data_dir=Path(".")).max_image_pixels  # the API's limit, the chat's too


def encoded(picture: Image.Image, kind: str, **options: object) -> bytes:
    out = io.BytesIO()
    picture.save(out, kind, **options)
    return out.getvalue()


@pytest.mark.parametrize(("kind", "mode", "media_type", "thumb_type"), [
    ("PNG", "RGBA", "image/png", "image/png"),
    ("PNG", "RGB", "image/png", "image/jpeg"),
    ("JPEG", "RGB", "image/jpeg", "image/jpeg"),
    ("WEBP", "RGB", "image/webp", "image/jpeg"),
    ("GIF", "P", "image/gif", "image/jpeg"),
])
def test_the_four_kinds_are_taken_with_a_thumbnail(kind: str, mode: str, media_type: str,
                                                   thumb_type: str) -> None:
    picture = Image.new(mode, (900, 300), 120)
    raw = encoded(picture, kind)
    image = checked_image(raw, "p", 10 << 20, PIXELS)
    assert (image.media_type, image.width, image.height, image.data) == (
        media_type, 900, 300, raw)
    assert image.thumb_type == thumb_type
    thumb = Image.open(io.BytesIO(image.thumb))
    assert thumb.size == (THUMB_SIDE, round(THUMB_SIDE / 3))


def test_an_animated_gif_is_kept_whole_and_a_photo_turned_as_held() -> None:
    frames = [Image.new("P", (40, 20), i * 60) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    image = checked_image(out.getvalue(), "a.gif", 1 << 20, PIXELS)
    assert image.data == out.getvalue() and (image.width, image.height) == (40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: turned 90 degrees
    photo = encoded(Image.new("RGB", (60, 20), (200, 10, 10)), "JPEG", exif=exif)
    turned = checked_image(photo, "photo.jpg", 1 << 20, PIXELS)
    assert Image.open(io.BytesIO(turned.thumb)).size == (20, 60)


def test_other_files_are_refused_by_name(tmp_path: Path) -> None:
    bmp = encoded(Image.new("RGB", (4, 4)), "BMP")
    with pytest.raises(ChatError, match=r"“x\.bmp” is a BMP image; the chat takes PNG") as bmp_err:
        checked_image(bmp, "x.bmp", 1 << 20, PIXELS)
    assert bmp_err.value.status_code == 400
    with pytest.raises(ChatError, match="is empty"):
        checked_image(b"", "e.png", 1 << 20, PIXELS)
    side = int(PIXELS ** 0.5) + 10
    huge = encoded(Image.new("1", (side, side)), "PNG")  # small file, too many pixels
    with pytest.raises(ChatError, match="at most 25,000,000") as many:
        checked_image(huge, "huge.png", 10 << 20, PIXELS)
    assert many.value.status_code == 413
    # the API's limit, as the server is set: a smaller one refuses a smaller picture
    with pytest.raises(ChatError, match=r"has 8x8 pixels; pictures may have at most 63"):
        checked_image(encoded(Image.new("RGB", (8, 8)), "PNG"), "p.png", 1 << 20, 63)
    config = WebConfig(data_dir=tmp_path, chat_image_bytes=1 << 20,
                       chat_conversation_image_bytes=2000)
    small = encoded(Image.new("RGB", (8, 8)), "PNG")
    assert len(checked_images([("a", small)], config, held=1000)) == 1
    with pytest.raises(ChatError, match="would hold") as full:
        checked_images([("a", small)], config, held=2000 - len(small) + 1)
    assert full.value.status_code == 413
    # as many pictures a message as one API request may carry
    few = WebConfig(data_dir=tmp_path, max_images=2)
    assert len(checked_images([("a", small)] * 2, few)) == 2
    with pytest.raises(ChatError, match="3 pictures attached; a message may carry at most 2"):
        checked_images([("a", small)] * 3, few)
    with pytest.raises(ChatError, match="takes no pictures"):
        checked_images([("a", small)], WebConfig(data_dir=tmp_path, max_images=0))

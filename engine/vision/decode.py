"""Image bytes from a request: a `data:` URL decoded by Pillow, checked before any pixel work.

Only what a request can carry inline is read (PNG, JPEG, WebP, GIF: its first frame); remote
URLs are refused by the caller. The pixel limit is checked on the header's size, before the
image is decoded, so a small file that claims a huge canvas costs nothing.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Pillow loads where a picture is read: ~2.5 MB a text server never uses
    from PIL import Image

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


class ImageError(ValueError):
    """An image a request carries cannot be used; `code` names the kind (the API's 400)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class DecodedImage:
    image: Image.Image  # RGB, or RGBA / LA / P with transparency (the processor flattens it)
    digest: str  # sha256 of the file's bytes: the encoder cache's and prefix cache's key


def data_url_bytes(url: str) -> bytes:
    """The bytes of a base64 `data:` URL (`data:image/png;base64,...`)."""
    head, comma, payload = url.partition(",")
    if not comma or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageError("an image URL must be a base64 data: URL (data:image/png;base64,...)",
                         "invalid_image_url")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image's data: URL is not valid base64", "invalid_image") from None


def decode(data: bytes, max_pixels: int) -> DecodedImage:
    """Open `data` as an image of at most `max_pixels` pixels (width x height)."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except (OSError, ValueError, Image.DecompressionBombError):
        raise ImageError("the image could not be read: send a PNG, JPEG, WebP or GIF",
                         "invalid_image") from None
    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(f"the image has {width} x {height} = {width * height} pixels, above "
                         f"this server's limit of {max_pixels}", "image_too_large")
    if width < 1 or height < 1:
        raise ImageError("the image is empty", "invalid_image")
    try:
        image.seek(0)  # an animated GIF or WebP: its first frame
        image.load()
    except (OSError, ValueError, EOFError):
        raise ImageError("the image could not be decoded (truncated or corrupt)",
                         "invalid_image") from None
    return DecodedImage(image, hashlib.sha256(data).hexdigest())

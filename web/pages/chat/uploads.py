"""Pictures attached to a chat message: each file checked (a PNG, JPEG, WebP or GIF that
Pillow opens, within the size limits and the API's `max_images` and `max_image_pixels`, so
the chat and the API refuse the same pictures), given a small thumbnail, and counted
against its conversation's limit. The type comes from the file's own bytes, never from the
name or the type the browser claims.

Decoding runs on a worker thread (`checked_images` is called through anyio.to_thread): a
large picture takes a while to read, and the event loop serves everyone's streams."""
from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from web.config import WebConfig
from web.pages.chat.rules import ChatError
from web.storage.images import NewImage

if TYPE_CHECKING:  # Pillow loads where a picture is read: ~2.5 MB a text server never uses
    from PIL import Image

MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp",
               "GIF": "image/gif"}
THUMB_SIDE = 320  # the longer side of a thumbnail, in pixels (sharp at 2x for 160 css px)


def size_words(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1_000_000 else f"{max(1, round(n / 1e3))} kB"


def _thumbnail(picture: Image.Image) -> tuple[bytes, str]:
    """A small PNG (pictures with transparency) or JPEG of the first frame."""
    from PIL import ImageOps

    picture.seek(0)
    small = ImageOps.exif_transpose(picture.copy())  # a phone's photo the way it was held
    small.thumbnail((THUMB_SIDE, THUMB_SIDE))
    out = io.BytesIO()
    if small.mode in ("RGBA", "LA", "PA") or "transparency" in small.info:
        small.convert("RGBA").save(out, "PNG", optimize=True)
        return out.getvalue(), "image/png"
    small.convert("RGB").save(out, "JPEG", quality=85)
    return out.getvalue(), "image/jpeg"


def checked_image(raw: bytes, name: str, limit: int, max_pixels: int) -> NewImage:
    """One attached file as stored, or ChatError (413 too large, 400 not a picture);
    `max_pixels` (width x height) is checked from the header, before decoding."""
    from PIL import Image, UnidentifiedImageError

    label = f"“{name[:80]}”" if name else "the picture"
    if len(raw) > limit:
        raise ChatError(f"{label} is {size_words(len(raw))}; pictures may be at most "
                        f"{size_words(limit)}", 413)
    if not raw:
        raise ChatError(f"{label} is empty", 400)
    kind = ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw)) as picture:
                kind = picture.format or ""
                if kind not in MEDIA_TYPES:
                    raise ChatError(f"{label} is a {kind or 'file'} image; the chat takes "
                                    "PNG, JPEG, WebP and GIF", 400)
                width, height = picture.size
                if width * height > max_pixels:
                    raise ChatError(f"{label} has {width}x{height} pixels; pictures may "
                                    f"have at most {max_pixels:,}", 413)
                picture.load()  # the whole file decodes: a truncated one is refused here
                thumb, thumb_type = _thumbnail(picture)
    except ChatError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError,
            Image.DecompressionBombWarning):
        raise ChatError(f"{label} is not a picture the chat can read (PNG, JPEG, WebP or "
                        "GIF)", 400) from None
    except (OSError, ValueError, SyntaxError, EOFError):  # a damaged or truncated file
        raise ChatError(f"{label} is damaged: it does not decode as {kind}", 400) from None
    return NewImage(MEDIA_TYPES[kind], width, height, raw, thumb, thumb_type)


def checked_images(files: Sequence[tuple[str, bytes]], config: WebConfig,
                   held: int = 0, per_message: bool = True) -> list[NewImage]:
    """The attached files (name, bytes) of one message (`per_message`; else of a whole
    imported conversation), each checked, or ChatError naming the first refused; `held`:
    bytes of pictures the conversation already holds."""
    if per_message and files and not config.max_images:
        raise ChatError("this server takes no pictures (its max_images is 0)", 400)
    if per_message and len(files) > config.max_images:
        raise ChatError(f"{len(files)} pictures attached; a message may carry at most "
                        f"{config.max_images}", 400)
    total = held + sum(len(raw) for _, raw in files)
    if total > config.chat_conversation_image_bytes:
        raise ChatError(f"the conversation would hold {size_words(total)} of pictures; at "
                        f"most {size_words(config.chat_conversation_image_bytes)} (start a "
                        "new chat for more)", 413)
    return [checked_image(raw, name, config.chat_image_bytes, config.max_image_pixels)
            for name, raw in files]

"""Whether a model takes pictures, which served models do, which of a conversation's pictures
go to it (the API's limits: `max_images` a request, `max_image_pixels` a picture), and a
message's pictures as the OpenAI-style content parts the prompt path takes (a data: URL per
picture)."""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from engine import ModelInfo
from web.config import WebConfig
from web.services import Services
from web.serving import Serving
from web.storage.images import StoredImage
from web.storage.store import Store


def takes_images(model: Serving | ModelInfo) -> bool:
    """Whether a model (its Engine, its ModelView in a set, or its ModelInfo) takes pictures.
    A gateway to upstream servers and a whole set of models have no such attribute: they
    are never sent pictures."""
    if isinstance(model, ModelInfo):
        return model.takes_images
    return bool(getattr(model, "takes_images", False))


def vision_models(s: Services) -> list[str]:
    """The served models that take pictures, as the model menu names them."""
    if s.catalog is None:
        return [s.config.model_name] if takes_images(s.engine) else []
    return [m.name for m in s.catalog.models() if takes_images(m)]


def model_takes_images(s: Services, model: str | None) -> bool:
    """Whether the conversation's model (None: the default) takes pictures, without opening
    or loading it."""
    if s.catalog is None:
        return takes_images(s.engine)
    name = model or s.catalog.default
    return any(takes_images(m) for m in s.catalog.models() if m.name == name)


def left_out_words(model: str, count: int, others: list[str]) -> str:
    """Why a reply was written without the conversation's pictures, and where to go."""
    what = "your picture was" if count == 1 else f"the conversation's {count} pictures were"
    said = f"{model} cannot take images, so {what} not sent to it (it read the words only)"
    if others:
        return f"{said}; models here that can: {', '.join(others)} (pick one in the model menu)"
    return f"{said}, and no model this server serves takes images"


def data_url(store: Store, image: StoredImage) -> str:
    data = store.image_data(image.id) or b""
    return f"data:{image.media_type};base64,{base64.b64encode(data).decode('ascii')}"


def content_parts(store: Store, text: str, images: list[StoredImage]) -> list[dict[str, Any]]:
    """A user message with pictures: each picture, then its text (the order vision models
    are trained on), as OpenAI's chat API writes them."""
    return [*({"type": "image_url", "image_url": {"url": data_url(store, im)}}
              for im in images),
            {"type": "text", "text": text}]


@dataclass(frozen=True, slots=True)
class Sent:
    """Which of a conversation's pictures go to a vision model: the API's limits hold for
    the chat too, so a picture stored under a larger limit never reaches the engine."""

    pictures: dict[int, list[StoredImage]]  # by message id
    too_large: int  # above max_image_pixels
    older: int  # beyond max_images in one request (the newest are sent)


def sent_pictures(pictures: dict[int, list[StoredImage]], config: WebConfig) -> Sent:
    """The newest pictures up to `max_images`, each within `max_image_pixels`."""
    kept: dict[int, list[StoredImage]] = {}
    too_large = older = count = 0
    for message_id in sorted(pictures, reverse=True):
        for im in reversed(pictures[message_id]):
            if im.width * im.height > config.max_image_pixels:
                too_large += 1
            elif count >= config.max_images:
                older += 1
            else:
                count += 1
                kept.setdefault(message_id, []).insert(0, im)
    return Sent(kept, too_large, older)


def limit_words(sent: Sent, config: WebConfig) -> list[str]:
    """Why some pictures were not sent to a model that takes them."""
    words = []
    if sent.too_large:
        one = sent.too_large == 1
        words.append(f"{'1 picture was' if one else f'{sent.too_large} pictures were'} not "
                     f"sent: {'it has' if one else 'each has'} more than "
                     f"{config.max_image_pixels:,} pixels, this server's limit")
    if sent.older:
        which = "oldest picture was" if sent.older == 1 else \
            f"{sent.older} oldest pictures were"
        words.append(f"the {which} not sent: at most {config.max_images} go to the model "
                     "with one message")
    return words

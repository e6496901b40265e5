"""Images in chat messages: OpenAI `image_url` content parts into a vision model's prompt.

`prompt_with_images` is the one path from OpenAI-style messages (content parts with
`{"type": "image_url", "image_url": {"url": "data:..."}}`) to prompt ids and placed images;
the API and the chat page both use it. Decoding and preprocessing run on a worker thread,
never on the event loop nor on the engine thread. Remote http(s) URLs are fetched there too,
where `fetch_image_urls` allows it for the user (web/api/vision/fetch.py).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine import (
    AnyresConfig,
    FitConfig,
    ImageError,
    ImageInput,
    PatchConfig,
    ProcessorConfig,
    TilingConfig,
    anyres_layout,
    data_url_bytes,
    decode_image,
    expand_image_tokens,
    fit_image,
    image_tile_runs,
    patchify_image,
    preprocess_image,
    split_anyres,
    split_image,
    tile_digest,
    tile_text,
)
from web.api.errors import APIError
from web.api.vision.fetch import fetch_image, refusal
from web.config import WebConfig
from web.worker import below_engine

DETAILS = (None, "auto", "low", "high")  # OpenAI's; every image is processed the same way
# images decoding at once, across requests: bounds the memory decoded pixels take (a 1 MB
# PNG of one colour may hold 25 million pixels, 100 MB once decoded)
DECODES = threading.BoundedSemaphore(4)


@dataclass(frozen=True, slots=True)
class ImagePrompt:
    ids: list[int]
    images: tuple[ImageInput, ...]


@dataclass(frozen=True, slots=True)
class _Prepared:
    digest: str
    pixels: Any  # torch.Tensor [3, H, W]; a tiled image's: [tiles, 3, S, S]
    grid: tuple[int, int] | None = None  # a tiled image's rows and columns of tiles
    # an image at its own size (Qwen2.5-VL's patches): its positions' rows and columns
    positions: tuple[int, int] | None = None
    # the picture's (height, width) as sent, where its positions depend on it (LLaVA-NeXT)
    size: tuple[int, int] | None = None


def vision_of(engine: Any) -> Any:
    """The serving engine's image side (engine.execution.model.vision.VisionConfig), or None
    where it takes no images (a text model, a gateway)."""
    return getattr(engine, "vision", None) if getattr(engine, "takes_images", False) else None


def image_parts(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(where, part) of every image part in template messages (content given as a list)."""
    return [(f"messages[{i}].content[{j}]", part)
            for i, m in enumerate(messages) if isinstance(m.get("content"), list)
            for j, part in enumerate(m["content"]) if part.get("type") == "image_url"]


def check_images(messages: Sequence[dict[str, Any]], config: WebConfig, vision: Any,
                 model: str, may_fetch: bool = False) -> list[tuple[str, str]]:
    """Every image's (where, URL), or a 400: too many, a remote URL the user may not have
    fetched (web.api.vision.fetch.may_fetch), a text model."""
    parts = image_parts(messages)
    if not parts:
        return []
    if vision is None:
        raise APIError(f"the model {model} takes no images (it is a text-only model); send "
                       "text, or choose a vision model", param=parts[0][0],
                       code="model_takes_no_images")
    if len(parts) > config.max_images:
        raise APIError(f"too many images: {len(parts)} (at most {config.max_images} per "
                       "request)", param=parts[config.max_images][0], code="too_many_images")
    out = []
    for where, part in parts:
        image_url = part.get("image_url") or {}
        url = str(image_url.get("url") or "")
        if image_url.get("detail") not in DETAILS:
            raise APIError(f"{where}.image_url.detail must be auto, low or high",
                           param=f"{where}.image_url.detail")
        if url.startswith(("http://", "https://")) and not may_fetch:
            raise refusal(where)
        out.append((where, url))
    return out


def _refused(exc: ImageError, where: str) -> APIError:
    return APIError(str(exc), param=f"{where}.image_url.url", code=exc.code)


def _prepare(where: str, url: str,
             processor: ProcessorConfig | TilingConfig | PatchConfig | AnyresConfig | FitConfig,
             config: WebConfig) -> _Prepared:
    """Fetch (a remote URL check_images let through), decode and preprocess one image (never
    on the event loop). A small file may decode to `max_image_pixels` x 4 bytes, so only
    DECODES images decode at once."""
    remote = url.startswith(("http://", "https://"))
    try:
        # a fetch waits on the network, not a core: it takes no decoding place from others
        raw = fetch_image(url, where, config) if remote else data_url_bytes(url)
    except ImageError as exc:
        raise _refused(exc, where) from None
    with DECODES:
        try:
            decoded = decode_image(raw, config.max_image_pixels)
        except ImageError as exc:
            raise _refused(exc, where) from None
        if isinstance(processor, TilingConfig):
            tiles = split_image(decoded.image, processor)
            return _Prepared(decoded.digest, tiles.pixels, (tiles.rows, tiles.cols))
        if isinstance(processor, PatchConfig):
            try:
                patches = patchify_image(decoded.image, processor)
            except ValueError as exc:  # e.g. an aspect ratio past 200:1
                raise APIError(f"{where}: {exc}", param=f"{where}.image_url.url",
                               code="invalid_image") from None
            return _Prepared(decoded.digest, patches.pixels, positions=patches.merged)
        if isinstance(processor, AnyresConfig):
            anyres = split_anyres(decoded.image, processor)
            return _Prepared(decoded.digest, anyres.pixels, size=anyres.size)
        if isinstance(processor, FitConfig):
            return _Prepared(decoded.digest, fit_image(decoded.image, processor))
        return _Prepared(decoded.digest, preprocess_image(decoded.image, processor))


def with_placeholders(messages: Sequence[dict[str, Any]], placeholder: str | Sequence[str]
                      ) -> list[dict[str, Any]]:
    """Template messages whose content lists became strings: text parts joined, each image
    part replaced by the model's placeholder text (LLaVA's `<image>`), or the i-th image's
    own text where `placeholder` lists one per image (a tiled image's)."""
    texts = iter([placeholder] * len(image_parts(messages)) if isinstance(placeholder, str)
                 else placeholder)
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(next(texts) if p.get("type") == "image_url"
                           else str(p.get("text", "")) for p in content)
            m = {**m, "content": text}
        out.append(m)
    return out


def with_image_parts(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Template messages whose content lists the template reads as they are: text parts,
    and each image part as `{"type": "image"}` (where the template writes its placeholder,
    Gemma 3's `<start_of_image>`)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            m = {**m, "content": [{"type": "image"} if p.get("type") == "image_url"
                                  else {"type": "text", "text": str(p.get("text", ""))}
                                  for p in content]}
        out.append(m)
    return out


def build_image_prompt(messages: Sequence[dict[str, Any]], engine: Any, config: WebConfig,
                       model: str, render: Callable[..., list[int]],
                       cache: dict[str, Any] | None = None,
                       may_fetch: bool = False) -> ImagePrompt:
    """`prompt_with_images` for a caller already off the event loop (it blocks: decoding,
    preprocessing, the template). `cache` (a dict the caller keeps, e.g. across attempts
    that leave old turns out to fit the context) keeps each image's pixels by its URL;
    `may_fetch`: the user's remote URLs are fetched (web.api.vision.fetch.may_fetch)."""
    images = check_images(messages, config, vision_of(engine), model, may_fetch)
    if not images:
        return ImagePrompt(render(with_placeholders(messages, "")), ())
    vision = vision_of(engine)
    cache = {} if cache is None else cache
    prepared = []
    for where, url in images:
        if url not in cache:
            cache[url] = _prepare(where, url, vision.processor, config)
        prepared.append(cache[url])
    if isinstance(vision.processor, TilingConfig):
        return _place_tiles(messages, vision, prepared, render)
    if vision.image_text is not None:  # the template writes the placeholder (Gemma 3)
        ids = render(with_image_parts(messages),
                     image_text=(vision.placeholder, vision.image_text))
    elif vision.split_at_placeholder:  # no token spells the placeholder
        ids = render(with_placeholders(messages, vision.placeholder),
                     image_ids=(vision.placeholder, vision.image_token_id))
    else:
        ids = render(with_placeholders(messages, vision.placeholder))
    lengths = [_length(p, vision) for p in prepared]
    try:
        expanded, offsets = expand_image_tokens(ids, vision.image_token_id, lengths)
    except ValueError as exc:  # the text itself held the placeholder
        raise APIError(f"the messages hold {vision.placeholder!r} besides their image parts: "
                       f"{exc}", param="messages", code="invalid_image_placement") from None
    placed = tuple(ImageInput(p.digest, p.pixels, offset, length, vision.whole_images,
                              p.positions, p.size)
                   for p, offset, length in zip(prepared, offsets, lengths, strict=True))
    return ImagePrompt(expanded, placed)


def _length(prepared: _Prepared, vision: Any) -> int:
    """The positions an image takes: its own grid's, its size's (LLaVA-NeXT's features of
    its tiles, engine.vision.anyres), its rows of merged positions each with the token that
    ends it (Mistral 3's), or the model's per image."""
    if prepared.positions is not None:
        return prepared.positions[0] * prepared.positions[1]
    if prepared.size is not None:
        return anyres_layout(prepared.size, vision.processor,
                             vision.vit.image_size // vision.vit.patch_size).length
    if isinstance(vision.processor, FitConfig):  # Mistral 3's rows, each ended by a token
        rows, cols = vision.processor.grid(prepared.pixels)
        return rows * (cols + 1)
    return int(vision.tokens_per_image)


def _place_tiles(messages: Sequence[dict[str, Any]], vision: Any, prepared: list[_Prepared],
                 render: Callable[[list[dict[str, Any]]], list[int]]) -> ImagePrompt:
    """A tiled image's text (each tile's image tokens between its own tags) goes into the
    message before the template renders it, as the family's processor writes the prompt;
    each tile is then one encoder input over its run of image tokens."""
    per_tile = vision.tokens_per_image
    texts = [tile_text(*(p.grid or (0, 0)), per_tile, vision.placeholder) for p in prepared]
    ids = render(with_placeholders(messages, texts))
    tiles = [(p, i) for p in prepared for i in range(p.pixels.shape[0])]
    try:
        offsets = image_tile_runs(ids, vision.image_token_id, per_tile)
        if len(offsets) != len(tiles):
            raise ValueError(f"the prompt holds {len(offsets)} runs of image tokens for "
                             f"{len(tiles)} tiles")
    except ValueError as exc:  # the text itself held the placeholder
        raise APIError(f"the messages hold {vision.placeholder!r} besides their image parts: "
                       f"{exc}", param="messages", code="invalid_image_placement") from None
    placed = tuple(ImageInput(tile_digest(p.digest, i), p.pixels[i], offset, per_tile)
                   for (p, i), offset in zip(tiles, offsets))
    return ImagePrompt(ids, placed)


async def prompt_with_images(messages: Sequence[dict[str, Any]], engine: Any,
                             config: WebConfig, model: str,
                             render: Callable[..., list[int]],
                             may_fetch: bool = False) -> ImagePrompt:
    """OpenAI-style template messages (content a string, or a list of `text` and
    `image_url` parts) -> the prompt ids and its placed images. `render` turns messages into
    ids (the chat template; Tokenizer.apply_chat_template's `image_text` keyword passed on
    where the family's processor rewrites the rendered text). All of it (base64 decoding, Pillow,
    preprocessing, the template) runs on a worker thread. Raises APIError (400s with a
    `code`)."""
    return await below_engine(build_image_prompt, messages, engine, config, model, render,
                              None, may_fetch)

"""Where a prompt's images sit: each image's span of placeholder tokens, and the ids the
prefix cache keys pages by (an image's positions keyed by its digest, never its placeholder
id, so two different images never share KV)."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True, eq=False)
class ImageInput:
    """One preprocessed image in one prompt: positions [offset, offset + length) hold its
    embeddings (the model's encoder output, `length` rows)."""

    digest: str  # sha256 of the image file: the encoder cache's key
    # [3, H, W] float32 on the CPU, as the model's processor made it; None in the simulator
    pixels: torch.Tensor | None
    offset: int
    length: int
    # its positions attend to one another both ways (Gemma 3's): each sees the whole image,
    # so the image's positions are computed in one prefill chunk (chunk_end)
    whole: bool = False
    # (rows, cols) its positions lay out as, row by row, where the model's rotary
    # embedding places an image in two dimensions (Qwen2-VL's M-RoPE: mrope_positions)
    grid: tuple[int, int] | None = None
    # the picture's (height, width) as sent, where the family's rows depend on it
    # (LLaVA-NeXT's: which tiles, and which of their features are padding)
    size: tuple[int, int] | None = None

    @property
    def end(self) -> int:
        return self.offset + self.length


def expand(ids: Sequence[int], image_token: int,
           lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """(`ids` with the i-th `image_token` repeated lengths[i] times (the model's tokens per
    image), the offset of each image's first token). The prompt must hold exactly one
    `image_token` per image."""
    out: list[int] = []
    offsets: list[int] = []
    for t in ids:
        if t != image_token:
            out.append(t)
            continue
        if len(offsets) == len(lengths):
            raise ValueError("the prompt holds more image tokens than images")
        offsets.append(len(out))
        out.extend([t] * lengths[len(offsets) - 1])
    if len(offsets) != len(lengths):
        raise ValueError(f"the prompt holds {len(offsets)} image tokens for {len(lengths)} "
                         "images")
    return out, offsets


def runs(ids: Sequence[int], image_token: int, length: int) -> list[int]:
    """The offset of each run of `image_token` in `ids` (a tiled image's tiles: the prompt
    text already holds every tile's tokens), each run exactly `length` long."""
    offsets: list[int] = []
    i = 0
    while i < len(ids):
        if ids[i] != image_token:
            i += 1
            continue
        start = i
        while i < len(ids) and ids[i] == image_token:
            i += 1
        if i - start != length:
            raise ValueError(f"a run of {i - start} image tokens where a tile takes {length}")
        offsets.append(start)
    return offsets


def tile_digest(digest: str, tile: int) -> str:
    """A tiled image's tile as the encoder and prefix caches key it: drawn from the image's
    digest and the tile's place, so two images' tiles never share a key."""
    return hashlib.sha256(f"{digest}:{tile}".encode()).hexdigest()


def cache_ids(ids: Sequence[int], images: Sequence[ImageInput]) -> list[int]:
    """`ids` as the prefix cache keys them: every position of an image holds a negative
    number drawn from its digest (no token id is negative), so pages holding different
    images differ, and the same image at the same place matches."""
    if not images:
        return list(ids)
    out = list(ids)
    for image in images:
        key = -1 - int(image.digest[:15], 16)
        out[image.offset:image.end] = [key] * image.length
    return out


def chunk_end(images: Sequence[ImageInput], start: int, end: int) -> int:
    """Where a prefill chunk over positions [start, end) ends so that it never splits an
    image attended as a whole: an image it would cut is left to the next chunk when the
    chunk reaches it from before, or taken whole (past `end`, the budget) when the chunk
    begins at or inside it."""
    for image in images:
        if image.whole and image.offset < end < image.end:
            return image.offset if image.offset > start else image.end
    return end


def mrope_positions(images: Sequence[ImageInput], start: int,
                    end: int) -> tuple[list[int], list[int], list[int]]:
    """The (time, row, column) rotary positions of prompt positions [start, end), as
    Qwen2-VL's M-RoPE numbers them: text counts on by one in all three; an image with a
    `grid` of rows x cols all takes the time of its first position, its rows and columns
    counting from there; the text after it goes on from the image's largest position + 1,
    so each image shifts what follows by max(rows, cols) - rows * cols."""
    time: list[int] = []
    row: list[int] = []
    col: list[int] = []

    def text(lo: int, hi: int, shift: int) -> None:
        span = range(lo + shift, hi + shift)
        time.extend(span)
        row.extend(span)
        col.extend(span)

    shift, p = 0, start
    for image in sorted(images, key=lambda i: i.offset):
        if image.grid is None or image.offset >= end:
            continue
        rows, cols = image.grid
        if image.end > p:
            text(p, min(image.offset, end), shift)
            p = max(p, image.offset)
            base = image.offset + shift
            for k in range(p - image.offset, min(image.end, end) - image.offset):
                r, c = divmod(k, cols)
                time.append(base)
                row.append(base + r)
                col.append(base + c)
            p = min(image.end, end)
        shift += max(rows, cols) - rows * cols
    text(p, end, shift)
    return time, row, col

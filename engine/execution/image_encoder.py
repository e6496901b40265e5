"""A vision model's encoder work: images to the rows their positions hold, cached by digest.

Runs on the engine thread inside the round whose prefill chunk first reaches an image, so its
time is the round's (the scheduler counts an image's positions like prompt tokens). A later
chunk of the same image, the same image in another request, or a prompt that matched the
prefix cache up to an image's middle takes the cached rows. The cache is bounded by count;
the least recently used image goes first.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from engine.execution.model.decoder import CausalLM
from engine.vision import ImageInput

CACHED_IMAGES = 32  # encoder outputs kept (a 576-row LLaVA image: 4.5 MB at width 4096)


class ImageEncoder:
    def __init__(self, model: CausalLM, device: torch.device,
                 capacity: int = CACHED_IMAGES) -> None:
        self.model = model
        self.device = device
        self.capacity = capacity
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.encoded = 0  # images run through the encoder (the rest came from the cache)

    def __len__(self) -> int:
        return len(self._cache)

    def has(self, digest: str) -> bool:
        return digest in self._cache

    def rows(self, images: Sequence[ImageInput]) -> dict[str, torch.Tensor]:
        """Each image's encoder output [length, hidden], by digest: cached ones as they are,
        the others encoded now, one batch per pixel shape."""
        out: dict[str, torch.Tensor] = {}
        # one encoder batch per pixel shape and grid of positions
        todo: dict[tuple[tuple[int, ...], tuple[int, int] | None], dict[str, ImageInput]] = {}
        for image in images:
            hit = self._cache.get(image.digest)
            if hit is not None:
                self._cache.move_to_end(image.digest)
                out[image.digest] = hit
            else:
                key = (tuple(_pixels(image).shape), image.grid)
                todo.setdefault(key, {})[image.digest] = image
        for (_, grid), group in todo.items():
            pixels = torch.stack([_pixels(i) for i in group.values()]).to(self.device)
            encoded = (self.model.encode_images(pixels) if grid is None
                       else self.model.encode_images(pixels, grid))
            for (digest, image), rows in zip(group.items(), encoded):
                if rows.shape[0] != image.length:
                    raise ValueError(f"an image encodes to {rows.shape[0]} rows, its prompt "
                                     f"holds {image.length} positions for it")
                out[digest] = rows
                self._put(digest, rows)
            self.encoded += len(group)
        return out

    def _put(self, digest: str, rows: torch.Tensor) -> None:
        self._cache[digest] = rows
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)


def _pixels(image: ImageInput) -> torch.Tensor:
    if image.pixels is None:
        raise ValueError("an image without pixel values reached the encoder")
    return image.pixels

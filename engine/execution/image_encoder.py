"""A vision model's encoder work: images to the rows their positions hold, cached by digest.

Runs on the engine thread, ahead of the chunk that reaches an image: the scheduler stops a
request's chunk before an image whose rows are not cached (`has`) and each round carries
that request's encoder work, which `advance` runs a slice at a time (whole tower layers,
ENCODE_SLICE_S or one layer, whichever is more), so other requests' rounds run between the
slices rather than waiting for the whole tower. A chunk that reaches an image with no rows
cached (evicted meanwhile, or a prompt that matched the prefix cache up to an image's
middle) encodes it in that round (`rows`), finishing what `advance` began. A later chunk of
the same image and the same image in another request take the cached rows. The cache is
bounded by count; the least recently used image goes first.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import torch

from engine.execution.model.decoder import CausalLM
from engine.execution.model.encoder_steps import EncoderSteps, run_through
from engine.vision import ImageInput

CACHED_IMAGES = 32  # encoder outputs kept (a 576-row LLaVA image: 4.5 MB at width 4096)
# encoder time a round gives to images ahead of their chunks: short enough that the other
# requests' tokens keep coming, long enough that the image's own first token comes little
# later than with the tower run whole (a layer is the unit: some towers' layers take longer)
ENCODE_SLICE_S = 0.25


class ImageEncoder:
    def __init__(self, model: CausalLM, device: torch.device,
                 capacity: int = CACHED_IMAGES) -> None:
        self.model = model
        self.device = device
        self.capacity = capacity
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._started: dict[str, EncoderSteps] = {}  # by digest: encoder runs part way done
        self._layers_done: dict[str, int] = {}  # by digest, for those in `_started`
        self.slice_s = ENCODE_SLICE_S  # `advance`'s slice (0: one layer a round)
        self.encoded = 0  # images run through the encoder (the rest came from the cache)

    def __len__(self) -> int:
        return len(self._cache)

    def has(self, digest: str) -> bool:
        return digest in self._cache

    def advance(self, images: Sequence[ImageInput]) -> None:
        """Run the encoder on these images, in order, for about `slice_s`: at least one
        layer, stopping between layers. Each image that finishes goes to the cache."""
        deadline = time.perf_counter() + self.slice_s
        for image in images:
            while image.digest not in self._cache:
                steps = self._started.get(image.digest)
                if steps is None:
                    pixels = _pixels(image)[None].to(self.device)
                    steps = self._started[image.digest] = self.model.encode_steps(
                        pixels, image.grid, image.size)
                    self._layers_done[image.digest] = 0
                try:
                    next(steps)
                    self._layers_done[image.digest] += 1
                except StopIteration as done:
                    self._forget(image.digest)
                    self._finished(image, done.value[0])
                except Exception:
                    self._forget(image.digest)  # a failed run starts over, if asked
                    raise
                if time.perf_counter() >= deadline:
                    return

    def drop(self, images: Sequence[ImageInput]) -> None:
        """Forget encoder runs begun for these images (their request ended)."""
        for image in images:
            self._forget(image.digest)

    def layers_done(self, digest: str) -> int | None:
        """How many of the tower's layers an image begun ahead has run (None: not begun)."""
        return self._layers_done.get(digest)

    def _forget(self, digest: str) -> None:
        self._started.pop(digest, None)
        self._layers_done.pop(digest, None)

    def rows(self, images: Sequence[ImageInput]) -> dict[str, torch.Tensor]:
        """Each image's encoder output [length, hidden], by digest: cached ones as they are,
        the others encoded now (one batch per pixel shape; those begun, run to the end)."""
        for image in images:
            steps = self._started.get(image.digest)
            self._forget(image.digest)
            if steps is not None and image.digest not in self._cache:
                self._finished(image, run_through(steps)[0])
        out: dict[str, torch.Tensor] = {}
        # one encoder batch per pixel shape, grid of positions and picture size
        todo: dict[tuple[tuple[int, ...], tuple[int, int] | None, tuple[int, int] | None],
                   dict[str, ImageInput]] = {}
        for image in images:
            hit = self._cache.get(image.digest)
            if hit is not None:
                self._cache.move_to_end(image.digest)
                out[image.digest] = hit
            else:
                key = (tuple(_pixels(image).shape), image.grid, image.size)
                todo.setdefault(key, {})[image.digest] = image
        for (_, grid, size), group in todo.items():
            pixels = torch.stack([_pixels(i) for i in group.values()]).to(self.device)
            encoded = self.model.encode_images(pixels, grid, size)
            for (digest, image), rows in zip(group.items(), encoded):
                self._finished(image, rows)
                out[digest] = rows
        return out

    def _finished(self, image: ImageInput, rows: torch.Tensor) -> None:
        if rows.shape[0] != image.length:
            raise ValueError(f"an image encodes to {rows.shape[0]} rows, its prompt "
                             f"holds {image.length} positions for it")
        self._put(image.digest, rows)
        self.encoded += 1

    def _put(self, digest: str, rows: torch.Tensor) -> None:
        self._cache[digest] = rows
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)


def _pixels(image: ImageInput) -> torch.Tensor:
    if image.pixels is None:
        raise ValueError("an image without pixel values reached the encoder")
    return image.pixels

"""Vector arithmetic the embedding APIs answer with: Matryoshka truncation, cosine."""
from __future__ import annotations

import math
from collections.abc import Sequence

from web.api.errors import APIError


def check_dimensions(asked: int | None, width: int, matryoshka: Sequence[int]) -> int | None:
    """The width to cut vectors to (None: the model's own). A Matryoshka model may be cut to
    any width up to its own; another only "cut" to its own width (else a 400)."""
    if asked is None or asked == width:
        return None
    if asked < 1:
        raise APIError(f"dimensions must be a positive integer, got {asked}",
                       param="dimensions")
    if not matryoshka:
        raise APIError(f"this model's embeddings have {width} dimensions and cannot be "
                       "shortened (it is not a Matryoshka model)", param="dimensions")
    if asked > width:
        raise APIError(f"dimensions must be at most {width}, got {asked}", param="dimensions")
    return asked


def cut(vector: list[float], dims: int) -> list[float]:
    """The first `dims` values, at unit length again (as Matryoshka models are used)."""
    head = vector[:dims]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0

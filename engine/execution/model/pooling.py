"""Sentence vectors from an encoder's states: the pooling a sentence-transformers folder
names (its modules.json and Pooling module's config, in either the older flag form or the
`pooling_mode` string sentence-transformers writes since version 6), applied to packed
inputs."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from engine.execution.model.config import UnsupportedModel

Pooling = Literal["mean", "cls", "lasttoken"]
MODES: dict[str, Pooling] = {"mean": "mean", "cls": "cls", "lasttoken": "lasttoken"}


def read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def modules(folder: Path) -> list[dict[str, Any]]:
    """modules.json's entries ([] without one)."""
    path = folder / "modules.json"
    return list(json.loads(path.read_text())) if path.is_file() else []


def has_pooling_module(folder: Path) -> bool:
    try:
        return any(str(m.get("type", "")).endswith(".Pooling") for m in modules(folder))
    except (ValueError, OSError):
        return False


def pooling_of(folder: Path) -> tuple[Pooling, bool]:
    """(pooling, normalize) from the folder's sentence-transformers files; a folder without
    them pools by mean and normalizes (their common default)."""
    listed = modules(folder)
    normalize = not listed or any(str(m.get("type", "")).endswith(".Normalize")
                                  for m in listed)
    pool_dir = next((m.get("path", "") for m in listed
                     if str(m.get("type", "")).endswith(".Pooling")), "1_Pooling")
    pool = read_json(folder / pool_dir / "config.json")
    mode = pool.get("pooling_mode")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if isinstance(mode, str):
        if mode not in MODES:
            raise UnsupportedModel(f"pooling {mode!r} is not supported (mean, cls, lasttoken)")
        return MODES[mode], normalize
    if mode is not None:
        raise UnsupportedModel(f"pooling {mode!r} is not supported (one of mean, cls, "
                               "lasttoken)")
    if pool.get("pooling_mode_cls_token"):
        return "cls", normalize
    if pool.get("pooling_mode_lasttoken"):
        return "lasttoken", normalize
    others = [k for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                          "pooling_mode_weightedmean_tokens") if pool.get(k)]
    if others:
        raise UnsupportedModel(f"pooling {', '.join(others)} is not supported")
    return "mean", normalize


def pool_states(hidden: torch.Tensor, pooling: Pooling, lengths: Sequence[int]) -> torch.Tensor:
    """[T, hidden] packed states -> [inputs, hidden] float32 vectors, unnormalized."""
    dev = hidden.device
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=dev)
    starts = torch.cumsum(lens, 0) - lens
    h = hidden.float()
    if pooling == "cls":
        return h[starts]
    if pooling == "lasttoken":
        return h[starts + lens - 1]
    row_in = torch.repeat_interleave(torch.arange(len(lengths), device=dev), lens)
    sums = torch.zeros(len(lengths), h.shape[1], dtype=h.dtype, device=dev)
    sums.index_add_(0, row_in, h)
    return sums / lens[:, None].to(h.dtype)

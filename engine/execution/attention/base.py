"""The attention-backend interface: plan once per round, then attend once per layer.

A round is a packed batch of sequences. Sequence r computes `query_lens[r]` new tokens whose
positions are [kv_lens[r] - query_lens[r], kv_lens[r]); it attends causally over its whole
prefix, positions [0, kv_lens[r]), whose older K/V (cached prefix, earlier chunks, earlier
decodes) are already in the pool; a sliding-window layer's queries see only the last `window`
positions of it (their own included). Tokens are packed in sequence order, and sequences with a
single query token (decodes, one-token chunks) come first, so backends can split the round
into a decode part and a prefill part without reordering.

A backend may also offer a decode-only round to a fused native decoder layer
(`native_decode`): the model then runs each layer, attention included, in one C call
(engine.execution.model.fused_decode) instead of calling `forward`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.execution.kv_pool import KVPool
from engine.kernels import ops


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    query_lens: list[int]  # new tokens per sequence this round
    kv_lens: list[int]  # positions in the pool per sequence once this round's K/V are written
    page_tables: list[list[int]]  # pool pages per sequence (at least ceil(kv_len / page_size))
    slot_mapping: torch.Tensor  # [num_tokens] int64, pool slot each new token writes

    def __post_init__(self) -> None:
        n = len(self.query_lens)
        if len(self.kv_lens) != n or len(self.page_tables) != n:
            raise ValueError("query_lens, kv_lens and page_tables differ in length")
        seen_multi = False
        for q, kv, pages in zip(self.query_lens, self.kv_lens, self.page_tables):
            if q < 1 or kv < q:
                raise ValueError(f"bad sequence: query_len {q}, kv_len {kv}")
            if not pages:
                raise ValueError("a sequence has an empty page table")
            if q > 1:
                seen_multi = True
            elif seen_multi:
                raise ValueError("single-token sequences must come before longer ones")

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def num_single(self) -> int:
        """Leading sequences with one query token (the decode part)."""
        return sum(1 for q in self.query_lens if q == 1)


@dataclass(frozen=True, slots=True)
class NativeDecode:
    """What a fused native decoder layer needs from a decode-only round: the pool slot of
    each sequence's new K/V and the pages each sequence attends over (in the backend's pool)."""

    slots: torch.Tensor  # [seqs] int64, checked to lie inside the pool
    pages: ops.DecodePages


class AttentionBackend(ABC):
    """Owns the per-round metadata; the model calls `forward` once per layer."""

    name: str = "base"

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, windows: Sequence[int | None] = ()) -> None:
        """`windows`: per layer, the sliding window its queries attend over (the last this
        many positions, their own included; None or absent: all)."""
        if num_heads % num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.windows = tuple(w or None for w in windows)

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if layer < len(self.windows) else None

    @abstractmethod
    def prepare(self, inputs: AttentionInputs) -> None:
        """Build index tensors / plans for this round (shared by every layer)."""

    @abstractmethod
    def forward(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        """q [T, heads, d], kv [T, 2 (K, V), kv_heads, d] (may be strided views)
        -> [T, heads * d].

        Writes K/V into the pool at the round's slots, then attends over each full prefix.
        """

    def native_decode(self) -> NativeDecode | None:
        """This round for a fused native decoder layer, when the round only decodes and this
        backend stores and attends K/V in `pool` with Ferry's CPU kernels; else None (the
        model then calls `forward` per layer). Valid after `prepare`, until the next one."""
        return None

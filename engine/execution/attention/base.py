"""The attention-backend interface: plan once per round, then attend once per layer.

A round is a packed batch of sequences. Sequence r computes `query_lens[r]` new tokens whose
positions are [kv_lens[r] - query_lens[r], kv_lens[r]); it attends causally over its whole
prefix, positions [0, kv_lens[r]), whose older K/V (cached prefix, earlier chunks, earlier
decodes) are already in the pool; a sliding-window layer's queries see only the last `window`
positions of it (their own included). Rows in a `span` see one another both ways: each
also sees the later positions of its span (an image Gemma 3 attends as a whole). Tokens are
packed in sequence order, and sequences with a single query token (decodes, one-token
chunks) come first, so backends can split the round into a decode part and a prefill part
without reordering.

Models with local (sliding-window) layers keep those layers' K/V in a second pool
(`local_pool`) that holds only the window (engine.scheduling.sliding_kv): `AttentionInputs.local`
gives each sequence's local page table trimmed to the first page any of its queries this round
can see, and its KV length counted from there. Attention has no notion of absolute position
(rotary is applied before K is stored), so a local layer attends over that shifted view exactly
as over the whole prefix: the same kernels serve both pools.

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
class LocalInputs:
    """The round in the local layers' pool, per sequence: KV positions from the first kept
    page on, and the pages from there (the same query_lens as the global part)."""

    kv_lens: list[int]
    page_tables: list[list[int]]
    slot_mapping: torch.Tensor  # [num_tokens] int64, local pool slot each new token writes


@dataclass(frozen=True, slots=True)
class AttentionInputs:
    query_lens: list[int]  # new tokens per sequence this round
    kv_lens: list[int]  # positions in the pool per sequence once this round's K/V are written
    page_tables: list[list[int]]  # pool pages per sequence (at least ceil(kv_len / page_size))
    slot_mapping: torch.Tensor  # [num_tokens] int64, pool slot each new token writes
    local: LocalInputs | None = None  # required when the backend has a local pool
    # (sequence, first query row, rows): rows of a sequence that attend to one another both
    # ways (an image attended as a whole, Gemma 3's): each sees up to the span's last position
    spans: tuple[tuple[int, int, int], ...] = ()

    def part(self, local: bool) -> tuple[list[int], list[list[int]], torch.Tensor]:
        """(kv_lens, page_tables, slot_mapping) of the global or the local pool."""
        if not local:
            return self.kv_lens, self.page_tables, self.slot_mapping
        if self.local is None:
            raise ValueError("the backend has a local pool: the round needs its local inputs")
        return self.local.kv_lens, self.local.page_tables, self.local.slot_mapping

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
        for seq, first, rows in self.spans:
            if not (0 <= seq < n and first >= 0 and rows >= 1
                    and first + rows <= self.query_lens[seq]):
                raise ValueError(f"bad span: sequence {seq}, rows {first}..{first + rows}")
        if self.local is not None:
            loc = self.local
            if len(loc.kv_lens) != n or len(loc.page_tables) != n:
                raise ValueError("local kv_lens and page_tables differ in length")
            for q, kv, pages in zip(self.query_lens, loc.kv_lens, loc.page_tables):
                if kv < q or not pages:
                    raise ValueError(f"bad local sequence: query_len {q}, kv_len {kv}")

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
    local_slots: torch.Tensor | None = None  # the same in the local layers' pool
    local_pages: ops.DecodePages | None = None

    def at(self, local: bool) -> tuple[torch.Tensor, ops.DecodePages]:
        if local:
            assert self.local_slots is not None and self.local_pages is not None
            return self.local_slots, self.local_pages
        return self.slots, self.pages


class AttentionBackend(ABC):
    """Owns the per-round metadata; the model calls `forward` once per layer."""

    name: str = "base"

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, windows: Sequence[int | None] = (),
                 local_pool: KVPool | None = None) -> None:
        """`windows`: per layer, the sliding window its queries attend over (the last this
        many positions, their own included; None or absent: all). With `local_pool`, the
        layers with a window keep their K/V there (in layer order) and the others in `pool`;
        without, every layer l is layer l of `pool`."""
        if num_heads % num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.pool = pool
        self.local_pool = local_pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.windows = tuple(w or None for w in windows)
        # layer -> (its pool, its index there, whether that is the local pool)
        self.placement: list[tuple[KVPool, int, bool]] = []
        counts = [0, 0]
        for w in self.windows if local_pool is not None else ():
            local = w is not None
            self.placement.append((local_pool if local_pool and local else pool,
                                   counts[local], local))
            counts[local] += 1
        if local_pool is not None and (counts[0] != pool.num_layers
                                       or counts[1] != local_pool.num_layers):
            raise ValueError(f"{counts[0]} global and {counts[1]} local layers do not match "
                             f"the pools' {pool.num_layers} and {local_pool.num_layers}")

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if layer < len(self.windows) else None

    def place(self, layer: int) -> tuple[KVPool, int, bool]:
        """(pool, index in it, is it the local pool) of a model layer."""
        return self.placement[layer] if self.placement else (self.pool, layer, False)

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

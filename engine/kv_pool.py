"""The paged KV pool: every layer's keys and values for every KV position the engine holds.

One allocation, viewed per layer as K and V of shape [num_pages, page_size, kv_heads, head_dim]
(FlashInfer's "NHD" paged layout). A request owns pages, not rows of a batch: position p of a
request lives at slot pages[p // page_size] * page_size + p % page_size in every layer.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def slot_of(pages: Sequence[int], pos: int, page_size: int) -> int:
    return pages[pos // page_size] * page_size + pos % page_size


class KVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        # zeros, not empty: a padded gather may read a slot never written; it must be finite
        self.data = torch.zeros(num_layers, 2, num_pages, page_size, num_kv_heads, head_dim,
                                dtype=dtype, device=device)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Memory one KV position costs across all layers (to size `kv_tokens` from a budget)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return num_layers * 2 * num_kv_heads * head_dim * itemsize

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def paged(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one layer, each [num_pages, page_size, kv_heads, head_dim]."""
        return self.data[layer, 0], self.data[layer, 1]

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one layer flattened over positions: [num_slots, kv_heads, head_dim]."""
        shape = (self.num_slots, self.num_kv_heads, self.head_dim)
        return self.data[layer, 0].view(shape), self.data[layer, 1].view(shape)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V ([T, kv_heads, head_dim]) at `slots` ([T], int64)."""
        k_flat, v_flat = self.flat(layer)
        k_flat.index_copy_(0, slots, k)
        v_flat.index_copy_(0, slots, v)

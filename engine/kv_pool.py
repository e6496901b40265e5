"""The paged KV pool: every layer's keys and values for every KV position the engine holds.

One allocation, viewed per layer as K and V of shape [num_pages, kv_heads, page_size, head_dim]
(FlashInfer's "HND" paged layout). A request owns pages, not rows of a batch: position p of a
request lives at slot pages[p // page_size] * page_size + p % page_size in every layer.

Why heads before positions inside a page: a backend that gathers a request's prefix copies
whole (page, head) blocks of page_size * head_dim contiguous values (4 KiB for 16 x 64 fp32),
and the result is already head-major, [kv_heads, positions, head_dim], the layout batched
matmuls and SDPA want. Gathering per position moved 64-value rows and cost ~3x more on CPU.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def slot_of(pages: Sequence[int], pos: int, page_size: int) -> int:
    return pages[pos // page_size] * page_size + pos % page_size


class KVPool:
    layout = "HND"

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        # zeros, not empty: a padded gather reads pages past a sequence's end; must be finite
        self.data = torch.zeros(num_layers, 2, num_pages, num_kv_heads, page_size, head_dim,
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
        """(K, V) of one layer, each [num_pages, kv_heads, page_size, head_dim]."""
        return self.data[layer, 0], self.data[layer, 1]

    def blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) as rows of (page, head) blocks: [num_pages * kv_heads, page_size * head_dim].
        Row of page p, head h: p * kv_heads + h."""
        shape = (self.num_pages * self.num_kv_heads, self.page_size * self.head_dim)
        return self.data[layer, 0].view(shape), self.data[layer, 1].view(shape)

    def write_index(self, slots: torch.Tensor) -> torch.Tensor:
        """[T] slots -> [T * kv_heads] rows of the [.., head_dim]-row view, token-major."""
        page, off = slots // self.page_size, slots % self.page_size
        heads = torch.arange(self.num_kv_heads, device=slots.device)
        return ((page[:, None] * self.num_kv_heads + heads) * self.page_size
                + off[:, None]).flatten()

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new tokens' K/V ([T, kv_heads, head_dim]) at `rows` from `write_index`."""
        d = self.head_dim
        self.data[layer, 0].view(-1, d).index_copy_(0, rows, k.reshape(-1, d))
        self.data[layer, 1].view(-1, d).index_copy_(0, rows, v.reshape(-1, d))

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at `slots` as [T, kv_heads, head_dim] (for tests and tools)."""
        rows = self.write_index(slots)
        d, kvh = self.head_dim, self.num_kv_heads
        k = self.data[layer, 0].reshape(-1, d).index_select(0, rows).view(-1, kvh, d)
        v = self.data[layer, 1].reshape(-1, d).index_select(0, rows).view(-1, kvh, d)
        return k, v

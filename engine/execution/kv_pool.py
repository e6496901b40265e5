"""The paged KV pool: a group of layers' keys and values for every KV position it holds.

A model with local (sliding-window) layers has two: the global layers' pool, indexed by
`request.pages`, and the local layers' pool, which holds each request's window only, indexed
by `request.local_pages` from logical page `request.local_first` (`LocalTables` turns those
into a round's trimmed page tables; engine.scheduling.sliding_kv keeps the books).

One allocation; layer l is `data[l]`, shape [num_pages, 2, kv_heads, page_size, head_dim]
(K then V in each page; FlashInfer's single-tensor "HND" paged layout). A request owns pages,
not rows of a batch: position p of a request lives at slot
pages[p // page_size] * page_size + p % page_size in every layer.

Why this layout: a backend that gathers a request's prefix copies whole (page, K/V, head)
blocks of page_size * head_dim contiguous values (4 KiB for 16 x 64 fp32) in one
index_select for K and V together, and the result is already head-major
([kv_heads, positions, head_dim]), the layout batched matmuls and SDPA want. Gathering per
position moved 64-value rows and cost ~3x more on CPU.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.scheduling.request import Request


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
        self.data = torch.zeros(num_layers, num_pages, 2, num_kv_heads, page_size, head_dim,
                                dtype=dtype, device=device)
        # per-layer views made once: indexing `data` per layer per round costs Python time
        self._layers = list(self.data.unbind(0))
        self._blocks = [t.view(num_pages * 2 * num_kv_heads, page_size * head_dim)
                        for t in self._layers]

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Memory one KV position costs across all layers (to size `kv_tokens` from a budget)."""
        itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
        return num_layers * 2 * num_kv_heads * head_dim * itemsize

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def paged(self, layer: int) -> torch.Tensor:
        """One layer: [num_pages, 2 (K, V), kv_heads, page_size, head_dim]."""
        return self._layers[layer]

    def blocks(self, layer: int) -> torch.Tensor:
        """One layer as rows of blocks: [num_pages * 2 * kv_heads, page_size * head_dim];
        the block of page p, K (c=0) or V (c=1), head h is row (p * 2 + c) * kv_heads + h."""
        return self._blocks[layer]

    def locate(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] slots -> (pages, offsets in page), the index pair `write` takes."""
        return slots // self.page_size, slots % self.page_size

    def write(self, layer: int, where: tuple[torch.Tensor, torch.Tensor],
              kv: torch.Tensor) -> None:
        """Store new tokens' K and V, kv [T, 2, kv_heads, head_dim] (may be a strided view),
        at `where` = locate(slots): one scatter for both."""
        pages, offsets = where
        # a cache in another type than the model's (kv_dtype) takes its K/V rounded to it
        self._layers[layer][pages, :, :, offsets] = kv.to(self.dtype)

    def read(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """K/V at `slots` as [T, 2, kv_heads, head_dim] (for tests and tools)."""
        pages, offsets = self.locate(slots)
        return self._layers[layer][pages, :, :, offsets]


class LocalTables:
    """A round's local-pool inputs: per sequence, the pages from the first one its first
    query can see (request.local_pages hold logical pages local_first on), the KV length
    counted from there, and the local slot of each new token."""

    def __init__(self, page_size: int, window: int) -> None:
        self.page_size, self.window = page_size, window
        self.kv_lens: list[int] = []
        self.tables: list[list[int]] = []
        self.slots: list[int] = []

    def add(self, req: Request, start: int, end: int) -> None:
        ps, pages, held_from = self.page_size, req.local_pages, req.local_first
        first = max(0, start - self.window + 1) // ps
        if first < held_from or end > (held_from + len(pages)) * ps:
            raise ValueError(f"{req.id}: positions {start}..{end} need local pages "
                             f"{first}..{-(-end // ps) - 1}, it holds {held_from}.."
                             f"{held_from + len(pages) - 1}")
        self.tables.append(pages[first - held_from:])
        self.kv_lens.append(end - first * ps)
        self.slots.extend(pages[p // ps - held_from] * ps + p % ps for p in range(start, end))


"""Free list of KV pages in the shared pool (pure bookkeeping, no tensors)."""
from __future__ import annotations


class OutOfPages(RuntimeError):
    """The pool is exhausted even after evicting the prefix cache (an accounting bug)."""


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfPages("no free KV page")
        page = self._free.pop()
        self._is_free[page] = False
        return page

    def free(self, page: int) -> None:
        assert not self._is_free[page], f"page {page} freed twice"
        self._is_free[page] = True
        self._free.append(page)

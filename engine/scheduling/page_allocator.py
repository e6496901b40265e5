"""Free list of KV pages in a pool, and the pool base that accounts it in token positions
(pure bookkeeping, no tensors)."""
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


class PagePool:
    """A pool of `num_pages` pages of `page_size` positions and its free list; the global
    pool (KVAccounting) and the local layers' one (SlidingKV) both are one."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.total_pages = num_pages
        self.allocator = PageAllocator(num_pages)

    # -- positions, for admission and the dashboard --------------------------------------
    @property
    def total(self) -> int:
        return self.total_pages * self.page_size

    @property
    def free(self) -> int:
        return self.allocator.num_free * self.page_size

    @property
    def evictable(self) -> int:
        """Positions cached but reclaimable (none unless the pool caches prefixes)."""
        return 0

    @property
    def held(self) -> int:
        """Positions held by live requests, page-rounded."""
        return self.total - self.free - self.evictable

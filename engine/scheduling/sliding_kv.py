"""The local (sliding-window) layers' KV pages: a pool of their own, kept for the window only.

A local layer's query at position p sees positions (p - window, p]. So once a request has
computed `n` positions, its next query sees nothing before n - window + 1, and every page
wholly before that lies outside its window: it goes back to the free list (docs/models.md).
No two live requests share a local page (models with local layers run without the prefix
cache), so "outside the window of every sequence using it" is its owner's window.

A request's local pages are `req.local_pages`, holding logical pages `req.local_first` on.
It never holds more than `cap(req)` pages at once: its window plus one round's new tokens
(EngineConfig.local_pages_per_request), or its whole length when that is shorter. Its
reservation is what it may still take on top of what it holds, `cap - held`, so admission
(check 2c for this pool) guarantees every admitted request its pages, as in the global pool.
"""
from __future__ import annotations

from engine.config import EngineConfig
from engine.scheduling.page_allocator import OutOfPages, PagePool
from engine.scheduling.request import Request


class SlidingKV(PagePool):
    def __init__(self, config: EngineConfig) -> None:
        assert config.sliding_window > 0, "SlidingKV is for models with local layers"
        super().__init__(config.num_local_pages, config.page_size)
        self.window = config.sliding_window
        self.per_request = config.local_pages_per_request

    # -- admission (pages) -----------------------------------------------------------------
    def cap(self, req: Request) -> int:
        """The most local pages `req` holds at once over its whole life."""
        length = req.prompt_len + req.params.max_tokens
        return min(-(-length // self.page_size), self.per_request)

    def reservation(self, req: Request) -> int:
        """Pages an admitted request may still take beyond those it holds."""
        return max(0, self.cap(req) - len(req.local_pages))

    @property
    def free_pages(self) -> int:
        return self.allocator.num_free

    # -- request lifecycle -----------------------------------------------------------------
    def first_needed(self, position: int) -> int:
        """The first logical page a query at `position` (or later) can see."""
        return max(0, position - self.window + 1) // self.page_size

    def trim(self, req: Request) -> None:
        """Release the pages before the window of the request's next query."""
        first = self.first_needed(req.num_computed)
        while req.local_first < first and req.local_pages:
            self.allocator.free(req.local_pages.pop(0))
            req.local_first += 1
        if not req.local_pages:
            req.local_first = max(req.local_first, first)

    def grow(self, req: Request, num_positions: int) -> None:
        """Make sure local pages exist for positions [local_first * page_size, num_positions)."""
        need = -(-num_positions // self.page_size) - req.local_first - len(req.local_pages)
        for _ in range(need):
            if self.allocator.num_free == 0:
                raise OutOfPages(f"no local KV page left for {req.id}: accounting is broken")
            req.local_pages.append(self.allocator.allocate())

    def release(self, req: Request) -> None:
        for page in req.local_pages:
            self.allocator.free(page)
        req.local_pages = []
        req.local_first = 0

    def check(self, live: list[Request]) -> None:
        """Assert `free + held == total` for the local pool (it caches nothing), and that no
        request holds more than its cap."""
        held = 0
        for req in live:
            assert len(req.local_pages) <= self.cap(req), (
                f"{req.id} holds {len(req.local_pages)} local pages, its cap is {self.cap(req)}")
            held += len(req.local_pages)
        assert self.allocator.num_free + held == self.total_pages, (
            f"local KV accounting: free {self.allocator.num_free} + held {held} "
            f"!= {self.total_pages}")

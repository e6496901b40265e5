"""KV memory: the page allocator plus the prefix cache, accounted in token positions.

The scheduler asks this one object for prefix matches, page allocation and release, so the
invariant `free + cached + held == total` has a single owner.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.scheduling.page_allocator import OutOfPages, PagePool
from engine.scheduling.prefix_cache import Node, PrefixCache
from engine.scheduling.request import Request


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    node: Node | None
    pages: list[int]
    num_tokens: int


class KVAccounting(PagePool):
    def __init__(self, num_pages: int, page_size: int, prefix_cache: bool,
                 cache_outputs: bool = True, per_owner: bool = False) -> None:
        super().__init__(num_pages, page_size)
        self.cache = PrefixCache(page_size) if prefix_cache else None
        self.cache_outputs = cache_outputs  # the simulator knows only prompt ids
        self.per_owner = per_owner  # each owner's prefixes in a tree of its own

    def scope(self, req: Request) -> str:
        """The prefix-cache tree `req` reads and writes: its owner's, or the shared one."""
        return req.owner if self.per_owner else ""

    # held (PagePool) counts locked shared prefixes too: only unlocked ones are evictable
    @property
    def evictable(self) -> int:
        return self.cache.num_evictable * self.page_size if self.cache else 0

    def available_with(self, match: PrefixMatch) -> int:
        """free + evictable, measured as if `match` were locked."""
        lost = self.cache.unlocked_on_path(match.node) if self.cache and match.node else 0
        return self.free + self.evictable - lost * self.page_size

    # -- request lifecycle -----------------------------------------------------------------
    def match(self, req: Request, touch: bool = True) -> PrefixMatch:
        if self.cache is None or req.params.prompt_logprobs is not None or req.params.embed:
            # scoring the prompt needs the logits of every position: a cached prefix has none
            return PrefixMatch(None, [], 0)
        # At least the last prompt token is computed, to give logits.
        max_pages = (req.prompt_len - 1) // self.page_size
        node, pages = self.cache.match(req.cache_prompt, max_pages, touch, self.scope(req))
        return PrefixMatch(node, pages, len(pages) * self.page_size)

    def admit(self, req: Request, match: PrefixMatch) -> None:
        if self.cache is not None and match.node is not None:
            self.cache.lock(match.node)
        req.cache_node = match.node
        req.pages = list(match.pages)
        req.num_cached = match.num_tokens
        req.num_computed = match.num_tokens

    def grow(self, req: Request, num_positions: int) -> None:
        """Make sure pages exist for positions [0, num_positions)."""
        need = -(-num_positions // self.page_size) - len(req.pages)
        for _ in range(need):
            if self.allocator.num_free == 0 and self.cache is not None:
                self.cache.evict(1, self.allocator.free)
            if self.allocator.num_free == 0:
                raise OutOfPages(f"no KV page left for {req.id}: accounting is broken")
            req.pages.append(self.allocator.allocate())

    def shrink(self, req: Request, num_positions: int) -> None:
        """Free the pages past positions [0, num_positions): a speculative round's rejected
        drafts. Those pages hold only positions past the prompt, which the cache never has."""
        keep = -(-num_positions // self.page_size)
        assert keep >= req.prompt_len // self.page_size, f"{req.id}: shrinking into the prompt"
        while len(req.pages) > keep:
            self.allocator.free(req.pages.pop())

    def prompt_done(self, req: Request) -> None:
        """The prompt's full pages enter the cache, locked, so concurrent requests hit them."""
        if self.cache is not None and not req.params.embed:  # an encoder keeps no KV
            self._insert(req, req.cache_prompt, req.prompt_len // self.page_size, relock=True)

    def release(self, req: Request, keep: bool = True) -> None:
        """Return a finished request's pages: full ones to the cache (unless `keep` is False,
        e.g. after a failed round), the rest to the free list."""
        node = req.cache_node if isinstance(req.cache_node, Node) else None
        if self.cache is not None and keep and not req.params.embed:
            computed = req.num_computed if self.cache_outputs else min(req.num_computed,
                                                                        req.prompt_len)
            ids = req.cache_prompt + req.output_ids[:computed - req.prompt_len] \
                if computed > req.prompt_len else req.cache_prompt
            node_after = self._insert(req, ids, computed // self.page_size, relock=False)
            kept = self._path_pages(node_after)
        else:
            kept = self._path_pages(node) if node is not None else set()
        for page in req.pages:
            if page not in kept:
                self.allocator.free(page)
        if self.cache is not None and node is not None:
            self.cache.unlock(node)
        req.pages = []
        req.cache_node = None

    def _insert(self, req: Request, ids: list[int], num_pages: int, relock: bool) -> Node:
        assert self.cache is not None
        start = req.cache_node if isinstance(req.cache_node, Node) \
            else self.cache.root_for(self.scope(req))
        if relock:
            num_pages = self._lockable(start, ids, num_pages)
        if num_pages <= start.depth:
            return start
        # A duplicate page stays with the request while it lives; release() frees it.
        node = self.cache.insert(ids, req.pages[:num_pages], start, lambda page: None)
        if relock:
            self.cache.lock(node)
            if req.cache_node is not None:
                self.cache.unlock(req.cache_node)  # type: ignore[arg-type]
            req.cache_node = node
        return node

    def _lockable(self, start: Node, ids: list[int], num_pages: int) -> int:
        """Pages of `ids` that may enter the tree locked: stop before an unlocked node that
        already holds one of them (another request's cached copy). Locking it would take an
        evictable page that no reservation accounts for, while our own copy stays held."""
        assert self.cache is not None
        node = start
        for i in range(start.depth, num_pages):
            child = node.children.get(tuple(ids[i * self.page_size:(i + 1) * self.page_size]))
            if child is None:
                break  # the rest are new nodes over our own pages
            if child.lock_ref == 0:
                return i
            node = child
        return num_pages

    @staticmethod
    def _path_pages(node: Node) -> set[int]:
        pages = set()
        while node.parent is not None:
            pages.add(node.page)
            node = node.parent
        return pages

    def check(self, live: list[Request]) -> None:
        """Assert `free + cached + held == total`, with `held` counted from the live requests."""
        owned = 0
        for req in live:
            shared = self._path_pages(req.cache_node) if isinstance(req.cache_node, Node) else set()
            owned += sum(1 for page in req.pages if page not in shared)
        locked = (self.cache.num_pages - self.cache.num_evictable) if self.cache else 0
        pages = self.allocator.num_free + (self.cache.num_evictable if self.cache else 0)
        assert pages + owned + locked == self.total_pages, (
            f"KV accounting: free {self.allocator.num_free} + cached "
            f"{self.evictable // self.page_size} + held {owned + locked} != {self.total_pages}")

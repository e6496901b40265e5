"""Radix prefix cache over page-aligned token ids.

Each node is one full page: its key is that page's token ids and it owns that pool page.
A node is locked while a live request uses it (the lock counts on every ancestor too), so
only unlocked nodes are evictable, and an unlocked node's whole subtree is unlocked.

The tree has one root per scope: a prefix cached in one scope is never matched from another.
Shared-mode servers scope by the request's owner, so one user can never hit (or time) another
user's tokens; the default scope "" is the one cache every request of a local server shares.
All scopes draw on the one pool and one LRU order.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

PageKey = tuple[int, ...]


class Node:
    __slots__ = ("children", "depth", "key", "last_access", "lock_ref", "page", "parent")

    def __init__(self, key: PageKey, page: int, parent: Node | None) -> None:
        self.key = key
        self.page = page
        self.parent = parent
        self.children: dict[PageKey, Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.depth: int = 0 if parent is None else parent.depth + 1


class PrefixCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.roots: dict[str, Node] = {}
        self.root = self.root_for("")  # the default scope's
        self.num_pages = 0
        self.num_evictable = 0  # pages in unlocked nodes
        self._clock = itertools.count(1)
        # Candidate leaves for eviction, checked lazily when popped (entries may be stale).
        self._heap: list[tuple[int, int, Node]] = []

    def root_for(self, scope: str) -> Node:
        """The root of `scope`'s tree (made on first use; roots are never evicted)."""
        root = self.roots.get(scope)
        if root is None:
            root = self.roots[scope] = Node((), -1, None)
            root.lock_ref = 1  # never evicted
        return root

    def _keys(self, token_ids: Sequence[int], num_pages: int) -> list[PageKey]:
        p = self.page_size
        return [tuple(token_ids[i * p:(i + 1) * p]) for i in range(num_pages)]

    def match(self, token_ids: Sequence[int], max_pages: int, touch: bool = True,
              scope: str = "") -> tuple[Node, list[int]]:
        """Deepest node of `scope`'s tree matching whole pages of `token_ids`, at most
        `max_pages` deep."""
        node, pages = self.root_for(scope), []
        stamp = next(self._clock) if touch else 0
        for key in self._keys(token_ids, max_pages):
            child = node.children.get(key)
            if child is None:
                break
            if touch:
                child.last_access = stamp
            node = child
            pages.append(child.page)
        return node, pages

    def unlocked_on_path(self, node: Node) -> int:
        """Pages on the path to `node` that locking it would make unevictable."""
        n = 0
        while node.lock_ref == 0:
            n += 1
            node = node.parent  # type: ignore[assignment]
        return n

    def lock(self, node: Node) -> None:
        while node is not None:
            if node.lock_ref == 0:
                self.num_evictable -= 1
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "prefix cache lock underflow"
            if node.lock_ref == 0:
                self.num_evictable += 1
                if not node.children:
                    self._push(node)
            node = node.parent  # type: ignore[assignment]

    def insert(self, token_ids: Sequence[int], pages: Sequence[int], start_node: Node,
               free_page: Callable[[int], None]) -> Node:
        """Add the full pages of `token_ids` below `start_node` (which covers the first
        start_node.depth pages). Pages that duplicate an existing node go back via
        `free_page` unless the caller still needs them; returns the deepest node."""
        node = start_node
        stamp = next(self._clock)
        keys = self._keys(token_ids, len(pages))
        for i in range(node.depth, len(pages)):
            child = node.children.get(keys[i])
            if child is None:
                child = Node(keys[i], pages[i], node)
                node.children[keys[i]] = child
                self.num_pages += 1
                self.num_evictable += 1  # new nodes start unlocked
                self._push(child)
            elif child.page != pages[i]:
                free_page(pages[i])
            child.last_access = stamp
            node = child
        return node

    def _push(self, node: Node) -> None:
        heapq.heappush(self._heap, (node.last_access, id(node), node))

    def evict(self, num_pages: int, free_page: Callable[[int], None]) -> int:
        """Evict up to `num_pages` unlocked pages, least recently used leaves first."""
        evicted = 0
        while self._heap and evicted < num_pages:
            stamp, _, node = heapq.heappop(self._heap)
            parent = node.parent
            if (node.lock_ref or node.children or parent is None
                    or parent.children.get(node.key) is not node):
                continue  # stale: locked, grew children, or already evicted
            if stamp != node.last_access:
                self._push(node)  # touched since it was queued
                continue
            del parent.children[node.key]
            node.parent = None
            free_page(node.page)
            self.num_pages -= 1
            self.num_evictable -= 1
            evicted += 1
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                self._push(parent)
        return evicted

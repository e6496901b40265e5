"""While Ferry serves, the objects alive at its start are kept out of Python's full
collections (a full walk of them held every thread ~175 ms), and releasing memory still
collects whatever of them became garbage (an unloaded model's cycles)."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from engine.models.memory import release_memory, settled_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


@pytest.fixture(autouse=True)
def unsettled() -> Iterator[None]:
    gc.unfreeze()  # a server of another test in this process may have settled it
    yield
    gc.unfreeze()


def test_what_lives_at_the_start_is_settled_and_unsettled_at_the_end() -> None:
    node = Node()
    with settled_heap():
        assert gc.get_freeze_count() > 0
        gone = weakref.ref(node)
        del node
        gc.collect()  # a full collection: the settled cycle is not walked
        assert gone() is not None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None


def test_releasing_memory_collects_settled_garbage_and_settles_the_rest() -> None:
    node, kept = Node(), Node()
    with settled_heap():
        gone = weakref.ref(node)
        del node
        release_memory()
        assert gone() is None
        assert gc.get_freeze_count() > 0 and kept.me is kept
        later = weakref.ref(kept)
        del kept
        gc.collect()
        assert later() is not None  # settled again by release_memory


def test_releasing_memory_outside_serving_settles_nothing() -> None:
    release_memory()
    assert gc.get_freeze_count() == 0

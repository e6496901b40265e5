"""The process's resident memory, and giving freed memory back to the system."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def rss_bytes() -> int:
    """Resident set size of this process (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # no /proc (macOS): the peak, the best there is without psutil

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return 0


def total_memory() -> int:
    """The machine's memory in bytes (0 if unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


@contextmanager
def settled_heap() -> Iterator[None]:
    """While serving, every object alive at its start is exempt from Python's full
    collections (gc.freeze). A serving process holds ~360k objects (torch, transformers, the
    model's modules); a full collection walked them all, holding Python's lock for ~175 ms
    (2-core AMD EPYC), so every user's next token waited. Python runs one once the objects
    that outlived the younger collections number a quarter of those that survived the last
    full one: rare (none in 120 chats and three megabyte imports), but nothing bounded when.
    At its end they are collectable again, so a process that serves twice (the tests) leaks
    nothing."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release_memory() -> None:
    """Collect cycles, the settled objects' too (an unloaded model's are among them; what is
    left is settled again), then ask glibc to return free heap pages to the system (freed
    tensors otherwise stay in the allocator's arenas and the resident size does not drop)."""
    settled = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    if settled:
        gc.freeze()
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # musl has no malloc_trim
        pass

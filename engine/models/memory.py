"""The process's resident memory, and giving freed memory back to the system."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys


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


def release_memory() -> None:
    """Collect cycles, then ask glibc to return free heap pages to the system (freed tensors
    otherwise stay in the allocator's arenas and the resident size does not drop)."""
    gc.collect()
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

"""engine.execution.cpu.reuse_freed_memory: glibc keeps a freed block for the next round
instead of handing it back to the kernel and faulting it in again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# in a fresh process (glibc's thresholds at their defaults): the page faults of writing a
# 4 MB block, three times over, each freed before the next is allocated
SCRIPT = """
import ctypes, ctypes.util, json, resource, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "tuned":
    from engine.execution.cpu import reuse_freed_memory
    assert reuse_freed_memory()
def faults(size=4 << 20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps([faults() for _ in range(3)]))
"""


def block_faults(mode: str) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return list(json.loads(out))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_a_freed_block_is_reused_without_page_faults() -> None:
    untuned = block_faults("plain")
    if untuned[1] < 512:  # not glibc's defaults here (another allocator): nothing to compare
        pytest.skip(f"the C library reuses the block by itself: {untuned}")
    tuned = block_faults("tuned")
    # the first write faults the block in either way; after reuse_freed_memory the second
    # block is the first one again, where glibc by default maps it afresh (1,024 pages)
    assert tuned[0] >= 512 and tuned[1] < 64 and tuned[2] < 64, (tuned, untuned)

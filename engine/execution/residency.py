"""Where a loaded model's memory goes: its resident bytes by part, read from the pages
themselves.

* weights: the pages of the model's tensors that are resident (mincore), the memory-mapped
  GGUF file's included (blocks used in place count once they have been read);
* kv: the resident pages of the KV pools (allocated zeroed: a page counts once written);
* tokenizer: what opening the tokenizer and its chat template added to the process
  (Rust tokenizers and the transformers wrapper), measured when it was opened;
* vocabulary: tables kept per token beside the weights (llguidance's view of the
  vocabulary for constrained output), measured when built;
* other: what loading left beyond the weights and KV (allocator slack, the kernels' code).

Process-wide, `floor` is the resident size before any model loaded (Python, torch,
transformers, the web server), and the process's resident size is about the floor plus
every loaded model's parts.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.models.memory import release_memory

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PARTS = ("weights", "kv", "tokenizer", "vocabulary", "other")


@dataclass(frozen=True, slots=True)
class Footprint:
    """A loaded model's resident bytes by part (see the module's doc)."""

    weights: int = 0
    kv: int = 0
    tokenizer: int = 0
    vocabulary: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.tokenizer + self.vocabulary + self.other

    def as_dict(self) -> dict[str, int]:
        return {**{p: int(getattr(self, p)) for p in PARTS}, "total": self.total}

    def line(self) -> str:
        """"312 MB: weights 253, KV 24, tokenizer 15, vocabulary 12, other 8" (MB)."""
        mb = [f"{'KV' if p == 'kv' else p} {getattr(self, p) / 1e6:.0f}" for p in PARTS]
        return f"{self.total / 1e6:.0f} MB: " + ", ".join(mb)


def rollup() -> dict[str, int]:
    """This process's resident bytes: rss, anonymous and file (file-backed); zeros where
    /proc cannot be read."""
    out = {"rss": 0, "anonymous": 0, "file": 0}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[-1] == "kB":
                    if parts[0] == "Rss:":
                        out["rss"] = int(parts[1]) * 1024
                    elif parts[0] == "Anonymous:":
                        out["anonymous"] = int(parts[1]) * 1024
    except (OSError, ValueError):
        return out
    out["file"] = out["rss"] - out["anonymous"]
    return out


_libc: ctypes.CDLL | bool | None = False
_libc_lock = threading.Lock()


def _mincore() -> ctypes.CDLL | None:
    global _libc
    with _libc_lock:
        if _libc is False:
            name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
            try:
                _libc = ctypes.CDLL(name, use_errno=True) if name else None
            except OSError:
                _libc = None
            if _libc:
                _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
                _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return _libc if isinstance(_libc, ctypes.CDLL) else None


def resident(ranges: Iterable[tuple[int, int]]) -> int:
    """Resident bytes of the pages under (address, length) ranges, each page counted once;
    without mincore (not Linux), the ranges' whole length."""
    spans = sorted((a // PAGE * PAGE, -(-(a + n) // PAGE) * PAGE) for a, n in ranges if n > 0)
    merged: list[list[int]] = []
    for start, end in spans:  # overlapping ranges (views of one map) count once
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    libc = _mincore()
    total = 0
    for start, end in merged:
        count = (end - start) // PAGE
        vec = ctypes.create_string_buffer(count)
        if libc is None or libc.mincore(start, end - start, vec) != 0:
            total += end - start  # not a mapping mincore reads: count it whole
            continue
        # bit 0 says resident; the others are reserved (0)
        total += (count - vec.raw.count(0)) * PAGE
    return total


def trim() -> None:
    """Collect cycles and hand glibc's free heap pages back, so that a resident size read
    next is what is held, not what was freed (what an unload does: release_memory)."""
    release_memory()


def storages(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """(address, bytes) of each distinct CPU storage under `tensors` (an opaque tensor,
    oneDNN's packed weight, has none: `opaque_bytes`)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t.device.type != "cpu" or t.is_mkldnn:
            continue
        try:
            s = t.untyped_storage()
        except (NotImplementedError, RuntimeError):  # another opaque layout
            continue
        if s.nbytes():
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return list(seen.items())


def opaque_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the CPU tensors without an addressable storage (oneDNN's packed weights),
    all of them counted as resident (written when packed)."""
    total = 0
    for t in tensors:
        if t.device.type != "cpu":
            continue
        try:
            if not t.is_mkldnn:
                t.untyped_storage()
                continue
        except (NotImplementedError, RuntimeError):
            pass
        total += t.numel() * t.element_size()
    return total


def model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every tensor a model's modules hold: parameters, buffers, packed weights and the
    block data of quantized ones (QuantWeight.data, SplitWeight.parts)."""
    out: list[torch.Tensor] = []

    def add(value: object) -> None:
        data, parts = getattr(value, "data", None), getattr(value, "parts", None)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(data, torch.Tensor):  # a QuantWeight
            out.append(data)
        elif isinstance(parts, tuple):  # a SplitWeight
            for part in parts:
                add(part)

    for module in model.modules():
        for value in (*module._parameters.values(), *module._buffers.values(),
                      *vars(module).values()):
            add(value)
    return out


def mapped(path: str) -> tuple[list[tuple[int, int]], int]:
    """This process's mappings of the file at `path`: ((address, bytes) of each, the bytes
    of them resident in this process). Read from /proc/self/smaps, not with mincore, which
    tells whether a file's page is in the page cache, not whether this process maps it."""
    real = os.path.realpath(path)
    ranges: list[tuple[int, int]] = []
    rss, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=5)
                if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                    inside = len(head) == 6 and head[5].strip() == real
                    if inside:
                        a, b = (int(x, 16) for x in head[0].split("-"))
                        ranges.append((a, b - a))
                elif inside and head and head[0] == "Rss:":
                    rss += int(head[1]) * 1024
    except (OSError, ValueError):
        return [], 0
    return ranges, rss


MADV_DONTNEED = 4  # Linux: drop these pages from this process (a file's reload on use)


def release_unused_file_pages(path: str, tensors: Iterable[torch.Tensor]) -> int:
    """Drop from this process the pages of its maps of the file at `path` that no tensor in
    `tensors` lies on: the blocks that loading copied into another layout (stacked q/k/v
    and gate/up rows, repacked weights) and the header. Loading read them, so they were
    resident twice, once as the file and once as the copy. Unchanged pages of a private
    file map come back from the file if anything reads them again. Returns the bytes
    released (0 where this is not Linux)."""
    libc = _mincore()
    if libc is None:
        return 0
    maps, _ = mapped(path)
    used = sorted(storages(tensors))
    released = 0
    for start, size in maps:
        end, cursor = start + size, start
        gaps: list[tuple[int, int]] = []
        for a, n in used:
            if a + n <= cursor or a >= end:
                continue
            if a > cursor:
                gaps.append((cursor, a))
            cursor = max(cursor, a + n)
        gaps.append((cursor, end))
        released += sum(_drop_pages(libc, a, b) for a, b in gaps)
    return released


def _drop_pages(libc: ctypes.CDLL, start: int, end: int) -> int:
    """madvise(DONTNEED) the whole pages inside [start, end); the bytes dropped."""
    a, b = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    if b > a and libc.madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), MADV_DONTNEED) == 0:
        return b - a
    return 0


def release_file_range(maps: list[tuple[int, int]], address: int, nbytes: int) -> int:
    """Drop from this process the whole pages of [address, address + nbytes) that lie in
    `maps` (its maps of one file, as `mapped` gives them): bytes loading has read and copied
    into another form, released as it goes rather than all at its end. Only a file's map:
    its pages come back from the file if anything reads them again. Returns the bytes
    released."""
    libc = _mincore()
    if libc is None:
        return 0
    return sum(_drop_pages(libc, max(address, start), min(address + nbytes, start + size))
               for start, size in maps)


def weights_resident(tensors: Iterable[torch.Tensor], path: str | None) -> int:
    """Resident bytes of a model's tensors: mincore for the anonymous ones, the file's
    mapped pages (smaps) for the blocks used in place from a memory-mapped file."""
    tensors = list(tensors)
    ranges, opaque = storages(tensors), opaque_bytes(tensors)
    if path is None:
        return resident(ranges) + opaque
    maps, in_map = mapped(path)
    outside = [(a, n) for a, n in ranges
               if not any(m <= a < m + size for m, size in maps)]
    return resident(outside) + in_map + opaque


class Measured:
    """A resident-size delta around a block: `with Measured() as m: ...; m.bytes`. Other
    threads' allocations meanwhile count too (good enough at load time)."""

    def __enter__(self) -> Measured:
        trim()
        self._before = rollup()["rss"]
        self.bytes = 0
        return self

    def __exit__(self, *exc: object) -> None:
        trim()
        self.bytes = max(0, rollup()["rss"] - self._before)

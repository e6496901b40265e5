"""The CPU-feature cap: run every kernel as a smaller x86 CPU would (`FERRY_CPU`).

Most desktops have AVX2 (+ AVX-VNNI) and no AVX-512 or AMX, so a figure taken on a server
CPU says little about them. `FERRY_CPU=avx2|avx-vnni|avx512|amx` caps what runs, everywhere
it matters: Ferry's dot products (`ferry_qpath`), the bf16 tiles and the AMX kernel, the
`-march` the native kernels are compiled for (a separate cached build), and torch's own
kernels (ATen's dispatch, oneDNN, MKL), whose variables must be set before torch is imported
(`apply_torch_env`, called first thing by the `ferry` command). A cap above what the CPU has
changes nothing. Torch-free, so the command line can apply it before anything loads torch.
"""
from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ENV = "FERRY_CPU"


@dataclass(frozen=True, slots=True)
class Level:
    name: str
    path_mask: int  # the dot-product paths allowed, bit p for path p (quant_matmul.c)
    bf16: bool  # AVX512-BF16 and AMX-BF16 (bf16 tiles, the AMX kernel)
    march: tuple[str, ...]  # the native kernels' target below native
    torch_env: tuple[tuple[str, str], ...]


LEVELS: tuple[Level, ...] = (
    Level("avx2", 0b0011, False, ("-march=x86-64-v3",),
          (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"),
           ("MKL_ENABLE_INSTRUCTIONS", "AVX2"))),
    Level("avx-vnni", 0b0111, False, ("-march=x86-64-v3", "-mavxvnni"),
          (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI"),
           ("MKL_ENABLE_INSTRUCTIONS", "AVX2"))),
    Level("avx512", 0b1111, False, ("-march=x86-64-v4", "-mavx512vnni"),
          (("ATEN_CPU_CAPABILITY", "avx512"), ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI"),
           ("MKL_ENABLE_INSTRUCTIONS", "AVX512"))),
    Level("amx", 0b1111, True, (), ()),
)
NAMES = tuple(level.name for level in LEVELS)


class CpuLevelError(ValueError):
    """FERRY_CPU names no level."""


def _cpuinfo(field: str) -> str | None:
    """The first `field` of /proc/cpuinfo (None: no such file or field)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return None


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags (/proc/cpuinfo's; None where there is none)."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


def tuning() -> tuple[str, ...]:
    """Kernel constants measured per CPU maker, as the C kernels read them: on AMD's cores
    the weight prefetches go to L2 (Q_PREFETCH_LOCALITY 2), where L1 prefetches held a
    one-token product of short rows (Gemma 3 270M's LM head, 640 columns) to half the
    memory's speed; Intel's keep L1 (docs/kernels.md, Thresholds)."""
    return ("-DQ_PREFETCH_LOCALITY=2",) if _cpuinfo("vendor_id") == "AuthenticAMD" else ()


@cache
def detected() -> str | None:
    """The highest level this CPU has, "" below AVX2, None where it cannot be read (not
    x86, or no /proc/cpuinfo: there the cap still limits Ferry's paths at run time, but the
    kernels keep -march=native)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    flags = cpu_flags()
    if flags is None:
        return None
    if not {"avx2", "fma", "f16c"} <= flags:
        return ""
    if {"avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        if {"amx_tile", "amx_bf16", "avx512_bf16"} <= flags:
            return "amx"
        return "avx512"
    return "avx-vnni" if "avx_vnni" in flags else "avx2"


def requested(environ: MutableMapping[str, str] | None = None) -> Level | None:
    """The level FERRY_CPU asks for (None: no cap); a clear error for a name it cannot be."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    if not text:
        return None
    for level in LEVELS:
        if level.name == text:
            return level
    raise CpuLevelError(f"{ENV}={text!r} is not a CPU level (one of {', '.join(NAMES)})")


def _index(name: str) -> int:
    return NAMES.index(name)


def cap(environ: MutableMapping[str, str] | None = None) -> Level | None:
    """The level in force when it is below this CPU's: None when nothing is capped."""
    level = requested(environ)
    if level is None:
        return None
    have = detected()
    if have is not None and have != "" and _index(level.name) >= _index(have):
        return None  # the CPU has no more than the cap: nothing to take away
    return level


def describe(environ: MutableMapping[str, str] | None = None) -> str:
    """One line for `ferry doctor` and the banner."""
    have = detected()
    shown = "unknown" if have is None else (have or "below AVX2")
    try:
        level = requested(environ)
    except CpuLevelError as exc:
        return f"{shown}; {exc}"
    if level is None:
        return f"{shown} (all of it in use; {ENV}={'|'.join(NAMES)} caps it)"
    if cap(environ) is None:
        return f"{shown} ({ENV}={level.name}: at or above this CPU, nothing capped)"
    return f"capped to {level.name} by {ENV} (this CPU: {shown})"


def march(environ: MutableMapping[str, str] | None = None) -> tuple[str, ...]:
    """The native kernels' target flags: the cap's where this CPU is known to be above it."""
    level = cap(environ)
    if level is None or not level.march or detected() is None:
        return ("-march=native",)
    return level.march


def c_defines(environ: MutableMapping[str, str] | None = None) -> tuple[str, ...]:
    """The cap as the C kernels read it (quant_matmul.c's path mask, quant_tiles.c's bf16)."""
    level = cap(environ)
    if level is None:
        return ()
    return (f"-DFERRY_PATH_MASK={level.path_mask}", f"-DFERRY_CPU_BF16={int(level.bf16)}")


def allows_bf16(environ: MutableMapping[str, str] | None = None) -> bool:
    level = cap(environ)
    return level is None or level.bf16


def max_path(environ: MutableMapping[str, str] | None = None) -> int:
    """The highest dot-product path index the cap allows (quant.PATHS)."""
    level = cap(environ)
    return 3 if level is None else level.path_mask.bit_length() - 1


def apply_torch_env(environ: MutableMapping[str, str] | None = None) -> tuple[str, ...]:
    """Set torch's own ISA variables for the cap (those the user has not set); they are read
    when torch loads, so this runs before the first `import torch`. Returns what it set."""
    env = os.environ if environ is None else environ
    level = cap(env)
    if level is None:
        return ()
    done = []
    for key, value in level.torch_env:
        if key not in env:
            env[key] = value
            done.append(f"{key}={value}")
    return tuple(done)

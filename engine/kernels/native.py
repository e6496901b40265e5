"""Build (once per machine) and load Ferry's fused CPU kernels (csrc/) through ctypes.

Every csrc/*.c compiles into one shared library. The C has no torch or Python headers, so it
builds in seconds with the system C compiler; the result is cached under a name that hashes
every csrc/*.c and *.h, the flags and the compiler, so an edit or a different machine
rebuilds. The functions' argument types come from the headers' prototypes (cdecl.py).
Where no compiler works (or FERRY_NATIVE_KERNELS=0), `library()` returns None, says why in
`status()`, and every caller keeps its plain torch path: the kernels make things faster,
never possible.

The library links the libgomp that torch loaded, so its OpenMP regions run on the same
thread team as torch's own kernels (engine/cpu.py explains why a second team hurts).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from engine.kernels import cdecl, cpu_level

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
DISABLE_ENV = "FERRY_NATIVE_KERNELS"  # "0" turns the kernels off
PREFIX = "ferry_kernels-"  # a build's file: PREFIX + its CPU target + "-" + source hash + ".so"

_build_dir: Path | None = None
_status = "not loaded yet"


def sources() -> list[Path]:
    """The C files compiled together into the library."""
    return sorted(CSRC.glob("*.c"))


def headers() -> list[Path]:
    return sorted(CSRC.glob("*.h"))


@functools.cache
def declarations() -> cdecl.Declarations:
    """The headers' prototypes and structs (read without a compiler)."""
    return cdecl.parse(headers())


def struct(name: str) -> type[ctypes.Structure]:
    """The ctypes Structure of the C typedef `name` in csrc/*.h."""
    return declarations().structs[name]


def set_build_dir(path: Path) -> None:
    """Where compiled kernels are cached (the app passes its cache folder); before first use."""
    global _build_dir
    _build_dir = Path(path)


def status() -> str:
    """One line for `ferry doctor` and logs: loaded from where, or why not."""
    library()
    return _status


def _torch_lib_dir() -> Path:
    return Path(torch.__file__).parent / "lib"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _flags(libdir: Path) -> tuple[list[str], list[str]]:
    # FERRY_CPU: a capped build targets the smaller CPU (and is cached under its own key)
    compile_flags = ["-O3", *cpu_level.march(), *cpu_level.c_defines(), *cpu_level.tuning(),
                     "-fPIC", "-fopenmp", "-std=c11"]
    gomp = libdir / "libgomp.so.1"
    # torch's own libgomp when it ships one (Linux wheels), else the compiler's
    link = ([str(gomp), f"-Wl,-rpath,{libdir}"] if gomp.exists() else ["-fopenmp"]) + ["-lm"]
    return compile_flags, link


def _target(cc: str, compile_flags: list[str], link: list[str]) -> Path:
    version = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True,
                             timeout=30).stdout.splitlines()[:1]
    code = [f"{p.name}\0{p.read_text()}" for p in [*sources(), *headers()]]
    key = hashlib.sha256("\0".join([*code, cc, *version, *compile_flags, *link,
                                    platform.machine()]).encode()).hexdigest()[:16]
    return (_build_dir or default_build_dir()) / f"{PREFIX}{_flavour()}-{key}.so"


def default_build_dir() -> Path:
    """Where builds go when no folder was set (set_build_dir): one per user in the temp
    folder."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"ferry-kernels-{user}"


def _flavour() -> str:
    """The build's CPU target in its file name: a capped build (FERRY_CPU) and the native one
    are kept side by side, so switching between them does not recompile each time."""
    level = cpu_level.cap()
    return level.name if level is not None else "native"


def stale_builds(target: Path) -> list[Path]:
    """The builds beside `target` that it replaces: older sources for the same CPU target, and
    unnamed ones (from before builds named their target). Other targets' builds stay."""
    flavour = target.stem.removeprefix(PREFIX).rpartition("-")[0]
    stale = []
    for old in target.parent.glob(f"{PREFIX}*.so"):
        theirs, dash, _ = old.stem.removeprefix(PREFIX).rpartition("-")
        if old != target and (not dash or theirs == flavour):
            stale.append(old)
    return stale


def _check_private(path: Path) -> None:
    """Refuse a folder or file another user could have written: we load code from it."""
    if not hasattr(os, "getuid"):
        return  # Windows: per-user folders; no ownership bits to check
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{path} is not private to this user (owner {st.st_uid}, "
                           f"mode {oct(st.st_mode & 0o777)}); not loading code from it")


def _build(cc: str, compile_flags: list[str], link: list[str], target: Path) -> None:
    # build beside the target and rename: concurrent processes never load a half-written file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [cc, *compile_flags, "-shared", f"-I{CSRC}", *map(str, sources()), "-o", tmp,
               *link]
        # once per source version; a first start on a slow or busy machine may need minutes
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
        for old in stale_builds(target):
            old.unlink(missing_ok=True)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, building them first if needed; None where unavailable."""
    global _status
    if os.environ.get(DISABLE_ENV, "1") == "0":
        _status = f"off ({DISABLE_ENV}=0)"
        return None
    cc = _compiler()
    if cc is None:
        _status = "unavailable: no C compiler (install gcc for faster small-batch decode)"
        return None
    try:
        compile_flags, link = _flags(_torch_lib_dir())
        target = _target(cc, compile_flags, link)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(target.parent)
        if target.exists():
            _check_private(target)
        else:
            log.info("compiling Ferry's CPU kernels into %s", target)
            _build(cc, compile_flags, link, target)
        lib = ctypes.CDLL(str(target))
        for fn_decl in declarations().functions.values():
            fn = getattr(lib, fn_decl.name)
            fn.argtypes, fn.restype = fn_decl.argtypes, fn_decl.restype
    except Exception as exc:  # any failure here means: use the torch path
        _status = f"unavailable: {exc}"
        log.warning("Ferry's CPU kernels are unavailable, using plain torch: %s", exc)
        return None
    _status = f"native ({target})"
    return lib


def loaded() -> ctypes.CDLL:
    """The library, for callers that checked `library()` (ops.usable) first."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"Ferry's CPU kernels are not loaded: {_status}")
    return lib

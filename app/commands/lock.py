"""The lock that applies to this install (locks/<platform>.txt, written by `make lock`) and
the exact versions it pins: `ferry doctor` compares them with what is installed."""
from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

# the package root of a checkout, and of the desktop bundle (its _internal folder)
ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalize(name: str) -> str:
    """A distribution name as package indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_platform(cuda_build: bool) -> str:
    """The lock's name for this system: the CPU or CUDA one on Linux, by torch's build."""
    machine = platform.machine().lower()  # as the wheels name it: x86_64, aarch64, arm64
    if sys.platform == "linux":
        return f"linux-{machine}-{'cuda' if cuda_build else 'cpu'}"
    if sys.platform == "darwin":
        return f"macos-{machine}"
    if sys.platform == "win32":
        return f"windows-{'x86_64' if machine == 'amd64' else machine}"
    return f"{sys.platform}-{machine}"


def find_lock(name: str) -> Path | None:
    """locks/<name>.txt in a checkout or the bundle, else the copy a pip-installed Ferry
    carries in its environment (<prefix>/share/ferry/locks, pyproject's data-files)."""
    for folder in (ROOT / "locks", Path(sys.prefix) / "share" / "ferry" / "locks"):
        if (folder / f"{name}.txt").is_file():
            return folder / f"{name}.txt"
    return None


def read_pins(path: Path) -> dict[str, str]:
    """{normalized name: version} of every `name==version` line of a requirements lock."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[normalize(match.group(1))] = match.group(2)
    return pins

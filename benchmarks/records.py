"""Benchmark records: one JSON object a line in benchmarks/records.jsonl, one line a run.

A record says what was measured, on what, against what: the date and Ferry's commit, the CPU
(model, threads, the instruction sets that pick Ferry's kernel path), the peer and its build,
the model and workload, the method, and every repetition's figure for Ferry and for the peer.
Tables in README.md and docs/benchmarks.md are rendered from these (benchmarks/render.py).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

RECORDS = Path(__file__).resolve().with_name("records.jsonl")
# Instruction sets that choose a kernel path in Ferry or llama.cpp (from /proc/cpuinfo).
PATH_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16",
              "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True, slots=True)
class Record:
    date: str | None  # YYYY-MM-DD, UTC; None where the run's day was not written down
    commit: str | None  # Ferry's commit; None where it was not written down
    cpu: str  # model name as the OS reports it, with the number of threads used
    cpu_flags: tuple[str, ...]  # the kernel-path instruction sets the CPU has
    ferry_cpu: str  # "native" or the FERRY_CPU cap the run used ("avx2", ...)
    model: str
    workload: str  # e.g. "one chat", "32 at once"
    metric: str  # the unit of `ferry` and `peer_figures`, e.g. "decode tok/s per stream"
    method: str  # the tool and its settings
    ferry: tuple[float, ...]  # one figure per repetition
    peer: str | None = None  # e.g. "llama.cpp llama-server"; None: Ferry alone
    peer_build: str | None = None  # e.g. "b10470, native flags without AMX"
    peer_figures: tuple[float, ...] = ()
    notes: str = ""
    headline: bool = False  # shown in the README's table
    extra: dict[str, object] = field(default_factory=dict)  # TTFT/ITL and other figures

    @property
    def repetitions(self) -> int:
        return len(self.ferry)

    def to_json(self) -> str:
        data = asdict(self)
        data["cpu_flags"] = list(self.cpu_flags)
        data["ferry"] = list(self.ferry)
        data["peer_figures"] = list(self.peer_figures)
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Record:
        data = json.loads(line)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown record fields: {sorted(unknown)}")
        for name in ("cpu_flags", "ferry", "peer_figures"):
            data[name] = tuple(data.get(name, ()))
        record = cls(**data)
        if not record.ferry:
            raise ValueError(f"a record without Ferry's figures: {line[:80]}")
        return record


def load(path: Path = RECORDS) -> list[Record]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Record.from_json(line) for line in lines if line.strip()]


def append(record: Record, path: Path = RECORDS) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(record.to_json() + "\n")


def this_cpu(threads: int | None = None) -> tuple[str, tuple[str, ...]]:
    """(model name with threads, its kernel-path flags) of the machine running this."""
    name, flags = platform.processor() or platform.machine(), set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass  # not Linux: the name alone
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    return f"{name}, {threads} threads", tuple(f for f in PATH_FLAGS if f in flags)


def this_commit() -> str | None:
    """Ferry's commit, with "+dirty" when the work tree differs from it."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")

"""The memory budget: how many models and how many bytes may be loaded at once, and which
idle model gives way (least recently used first)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.models.memory import total_memory


@dataclass(frozen=True, slots=True)
class Resident:
    name: str
    size: int  # bytes
    busy: bool  # running or waiting requests: never unloaded under them
    last_used: float


@dataclass(frozen=True, slots=True)
class Budget:
    max_loaded: int
    max_memory: int  # bytes

    @classmethod
    def for_machine(cls, max_loaded: int | None = None, max_memory: int | None = None,
                    available: int | None = None) -> Budget:
        """Defaults that fit the machine: up to `available` bytes (a GPU's: its free memory
        and what is loaded already, less a reserve; default 3/4 of the machine's memory), and
        as many models as there are 4 GB in that (at least 1, at most 4)."""
        total = total_memory() or 8 << 30
        memory = max_memory if max_memory is not None else (
            available if available is not None else total * 3 // 4)
        loaded = max_loaded if max_loaded is not None else max(1, min(4, memory // (4 << 30)))
        if loaded < 1 or memory < 1:
            raise ValueError("max_loaded and max_memory must be >= 1")
        return cls(loaded, memory)

    def refusal(self, name: str, need: int, measured: bool) -> str | None:
        """Why a model of `need` bytes is never loaded under this budget (None: it may be):
        it would not fit even with every other model unloaded."""
        if need <= self.max_memory:
            return None
        how = "measured at its last load" if measured else "its file's size"
        return (f"{name} needs {need / 1e9:.2f} GB ({how}), more than the "
                f"{self.max_memory / 1e9:.2f} GB the loaded models may hold (--max-memory)")

    def make_room(self, resident: Sequence[Resident], need: int) -> list[str] | None:
        """The models to unload (idle ones, least recently used first) so that one of `need`
        bytes fits; None when it cannot fit until a busy model goes idle. (A model larger
        than the whole budget is refused before: `refusal`.)"""
        count = len(resident)
        used = sum(r.size for r in resident)
        victims: list[str] = []
        for r in sorted((r for r in resident if not r.busy), key=lambda r: r.last_used):
            if count + 1 <= self.max_loaded and (used + need <= self.max_memory or count == 0):
                break
            victims.append(r.name)
            count -= 1
            used -= r.size
        if count + 1 <= self.max_loaded and (used + need <= self.max_memory or count == 0):
            return victims
        return None

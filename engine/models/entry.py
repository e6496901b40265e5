"""One configured model's state in the set, what the set lists, and its load/unload events."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from engine.models.pending import Pending
from engine.models.source import ModelSource
from engine.runtime.engine import Engine

if TYPE_CHECKING:
    from engine.execution.text.tokenizer import Tokenizer

ModelState = Literal["unloaded", "loading", "loaded", "unloading"]


@dataclass(slots=True)
class ModelEntry:
    source: ModelSource
    keep_alive: float | None  # seconds idle before unloading; None = stays
    configured_keep_alive: float | None  # what a request that names none gets (Ollama's rule)
    state: ModelState = "unloaded"
    engine: Engine | None = None
    tokenizer: Tokenizer | None = None
    pending: list[Pending] = field(default_factory=list)
    last_used: float = 0.0
    loading_since: float | None = None
    size: int = 0  # bytes, once loaded
    measured: int = 0  # bytes its last load measured (the budget's figure for a reload)
    runs: str = ""
    error: str | None = None  # the last load's failure
    wanted: bool = False  # an admin asked to load it
    memory_wait: str | None = None  # why its load waits for memory
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def live(self) -> int:
        return len(self.pending) + (len(self.engine.live_ids()) if self.engine else 0)

    @property
    def busy(self) -> bool:
        """Loading, or requests running or waiting: never unloaded now."""
        return self.state == "loading" or self.live > 0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One configured model as /v1/models and the dashboard show it."""

    name: str
    default: bool
    state: ModelState
    size: int  # bytes: measured once loaded, else the file's size
    runs: str
    keep_alive: float | None
    live: int  # requests running or waiting for it
    details: Mapping[str, Any]
    error: str | None = None
    memory_wait: str | None = None
    memory: Mapping[str, int] | None = None  # resident bytes by part, while loaded

    @property
    def loaded(self) -> bool:
        return self.state == "loaded"


@dataclass(frozen=True, slots=True)
class ModelEvent:
    time: float  # wall clock
    model: str
    kind: Literal["loading", "loaded", "unloaded", "failed"]
    text: str

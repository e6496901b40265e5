"""One configured model's state in the set, what the set lists, and its load/unload events."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from engine.models.pending import Arrival, Pending
from engine.models.source import ModelSource
from engine.runtime.engine import Engine

if TYPE_CHECKING:
    from engine.execution.text.tokenizer import Tokenizer

ModelState = Literal["unloaded", "loading", "loaded", "unloading"]


@dataclass(slots=True)
class ModelEntry:
    source: ModelSource
    # seconds idle before unloading (None = stays): the server's setting, an admin's
    # request's (or the server's again when one names none), and a shorter one asked by the
    # normal user the model was loaded for, while no one else uses it
    configured_keep_alive: float | None
    admin_keep_alive: float | None
    user_keep_alive: float | None = None
    state: ModelState = "unloaded"
    engine: Engine | None = None
    tokenizer: Tokenizer | None = None
    pending: list[Pending] = field(default_factory=list)
    arrivals: list[Arrival] = field(default_factory=list)  # announced, prompt not ready yet
    loaded_for: str | None = None  # the one normal user whose request loaded it
    users: set[str] = field(default_factory=set)  # whose requests used it since its load
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
    def keep_alive(self) -> float | None:
        return self.user_keep_alive if self.user_keep_alive is not None \
            else self.admin_keep_alive

    @property
    def waiting(self) -> int:
        """Requests waiting for its load (announced ones included)."""
        return len(self.pending) + len(self.arrivals)

    @property
    def demanded(self) -> bool:
        """Requests (or an admin) ask for its load."""
        return bool(self.pending or self.arrivals or self.wanted)

    @property
    def admin_demand(self) -> bool:
        """An admin asks for its load: it may evict the default model to make room."""
        return self.wanted or any(p.admin for p in self.pending) or \
            any(a.admin for a in self.arrivals)

    @property
    def live(self) -> int:
        return self.waiting + (len(self.engine.live_ids()) if self.engine else 0)

    @property
    def busy(self) -> bool:
        """Loading, or requests running or waiting: never unloaded now."""
        return self.state == "loading" or self.live > 0

    def alone(self, owner: str) -> bool:
        """Loaded (or about to load) for `owner`, a normal user, and used by no one else
        since."""
        about_to = self.state == "unloaded" and not self.admin_demand and \
            self.demand_owners() <= {owner}
        return (self.loaded_for == owner or about_to) and self.users <= {owner}

    def demand_owners(self) -> set[str]:
        return {p.owner for p in self.pending} | {a.owner for a in self.arrivals}


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
    takes_images: bool = False  # a vision model (known from its files before it loads)

    @property
    def loaded(self) -> bool:
        return self.state == "loaded"


@dataclass(frozen=True, slots=True)
class ModelEvent:
    time: float  # wall clock
    model: str
    kind: Literal["loading", "loaded", "unloaded", "failed"]
    text: str

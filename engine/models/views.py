"""The model set's table (its models by name, their lock, the read side) and the per-model
view the web layer submits through.

The set (model_set.ModelSet), its monitor and its sharing rules all hold one ModelTable; a
ModelView holds the set only through the small ServingSet protocol, so this module imports
nothing of model_set."""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Protocol

from engine.config import ADMISSIONS, POLICIES, EngineConfig
from engine.models.entry import ModelEntry, ModelInfo, ModelState
from engine.models.pending import Arrival, Pending
from engine.runtime.engine import Engine
from engine.runtime.handle import RequestHandle
from engine.runtime.snapshot import EngineSnapshot, RequestView
from engine.scheduling.admission import WaitReason
from engine.scheduling.constraint import Constraint
from engine.scheduling.request import SamplingParams
from engine.text.reasoning import Reasoning
from engine.vision import ImageInput

if TYPE_CHECKING:
    from engine.execution.model.vision import VisionConfig
    from engine.execution.text.tokenizer import Tokenizer
    from engine.structured.compiler import GrammarCompiler


def memory_of(engine: Engine | None) -> dict[str, int] | None:
    """A loaded model's resident bytes by part (engine.execution.residency), else None."""
    parts = engine.footprint() if engine is not None else None
    return parts.as_dict() if parts is not None else None


class ModelTable:
    """The set's models by name, the lock that guards them, the config every model follows
    (the default model's: policy and limits for all), and what reads them. `entries` is
    replaced, never changed in place, so readers iterating the old dict are not disturbed."""

    def __init__(self, config: EngineConfig, entries: dict[str, ModelEntry]) -> None:
        self.config = config
        self.entries = entries
        self.lock = threading.RLock()

    def engine_of(self, model: str) -> Engine | None:
        with self.lock:
            return self.entries[model].engine

    def pending_views(self, entry: ModelEntry, now: float) -> list[RequestView]:
        if entry.state == "unloaded" and entry.memory_wait:
            reason = WaitReason("memory", f"waiting for {entry.memory_wait}")
        else:
            since = entry.loading_since if entry.state == "loading" and entry.loading_since \
                is not None else now
            reason = WaitReason("loading", f"loading {entry.name}, {now - since:.0f} s")
        # in arrival order: announced requests (prompt not ready yet) came before those
        # queued, unless they arrived later
        waiting: list[Pending | Arrival] = sorted([*entry.pending, *entry.arrivals],
                                                  key=lambda w: w.arrival)
        return [w.view(entry.name, now, reason, i + 1) for i, w in enumerate(waiting)]

    def owner_live(self, owner: str) -> int:
        """`owner`'s requests in the whole set: waiting for a load (or memory), queued or
        running on any model."""
        return sum(sum(1 for p in e.pending if p.owner == owner)
                   + sum(1 for a in e.arrivals if a.owner == owner)
                   + (len(e.engine.live_ids(owner)) if e.engine is not None else 0)
                   for e in self.entries.values())

    def models(self) -> list[ModelInfo]:
        with self.lock:
            default = next(iter(self.entries))
            engines = {e.name: e.engine for e in self.entries.values()}
            infos = [ModelInfo(e.name, e.name == default, self.shown_state(e),
                               e.size or e.source.size, e.runs, e.keep_alive, e.live,
                               e.source.details, e.error, e.memory_wait,
                               takes_images=(e.engine.vision if e.engine is not None
                                             else e.source.vision) is not None)
                     for e in self.entries.values()]
        return [dataclasses.replace(i, memory=memory_of(engines[i.name])) for i in infos]

    @staticmethod
    def shown_state(e: ModelEntry) -> ModelState:
        """`loading` from the moment a request asks for it (its load starts on the monitor's
        next turn, milliseconds later), as its requests' wait reason already says."""
        if e.state == "unloaded" and (e.pending or e.arrivals) and not e.memory_wait:
            return "loading"
        return e.state

    def opened_tokenizer(self, model: str) -> Tokenizer | None:
        """The model's tokenizer if opened already (never waits to open one), else None."""
        with self.lock:
            entry = self.entries.get(model)
        return entry.tokenizer if entry is not None else None

    def live_ids(self, owner: str | None = None) -> list[str]:
        with self.lock:
            ids = [p.handle.id for e in self.entries.values() for p in e.pending
                   if owner is None or p.owner == owner]
            ids += [a.id for e in self.entries.values() for a in e.arrivals
                    if owner is None or a.owner == owner]
            for e in self.entries.values():
                if e.engine is not None:
                    ids += e.engine.live_ids(owner)
        return ids

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no model has requests (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                engines = [e.engine for e in self.entries.values() if e.engine is not None]
                pending = any(e.pending or e.arrivals for e in self.entries.values())
            if not pending and all(e.wait_idle(max(0.0, deadline - time.monotonic()))
                                   for e in engines) and not self.live_ids():
                return True
            time.sleep(0.02)
        return False

    def reconfigure(self, policy: str | None = None, admission: str | None = None) -> None:
        """Change the policy / admission order of every model (and of those loaded later)."""
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        if admission is not None and admission not in ADMISSIONS:
            raise ValueError(f"unknown admission order {admission!r}")
        changes = {k: v for k, v in (("policy", policy), ("admission", admission)) if v}
        with self.lock:
            self.config = dataclasses.replace(self.config, **changes)  # type: ignore[arg-type]
            for e in self.entries.values():
                if e.engine is not None:
                    e.engine.reconfigure(policy, admission)

    def model_snapshots(self) -> list[tuple[str, EngineSnapshot | None]]:
        """Each model's own snapshot (None when not loaded), for the dashboard's sections."""
        with self.lock:
            engines = [(e.name, e.engine) for e in self.entries.values()]
        return [(name, engine.snapshot() if engine else None) for name, engine in engines]

    def task_of(self, model: str) -> str | None:
        """What the model does: its loaded engine's task ("generate", "embed", "score"),
        else what its source said of its files before it loaded (None: it did not say)."""
        with self.lock:
            entry = self.entries[model]
            engine = entry.engine
        if engine is not None:
            return engine.task
        task = entry.source.details.get("task")
        return str(task) if task else None

    def config_of(self, model: str) -> EngineConfig:
        with self.lock:
            engine = self.entries[model].engine
        return engine.config if engine is not None else self.config


class ServingSet(Protocol):
    """What a ModelView needs of its set (model_set.ModelSet)."""

    @property
    def alive(self) -> bool: ...

    table: ModelTable

    def arrive(self, model: str | None, owner: str, admin: bool = True,
               owner_limit: int | None = None) -> Arrival | None: ...

    def withdraw(self, arrival: Arrival) -> None: ...

    def tokenizer(self, model: str | None = None) -> Tokenizer: ...

    def submit(self, prompt_ids: list[int], params: SamplingParams, owner: str = "local",
               request_id: str | None = None, owner_limit: int | None = None,
               reasoning: Reasoning | None = None, model: str | None = None,
               keep_alive: object = ..., admin: bool = True,
               arrival: Arrival | None = None,
               images: tuple[ImageInput, ...] = ()) -> RequestHandle: ...

    def grammars(self, model: str) -> GrammarCompiler: ...

    def start(self) -> object: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool: ...

    def handle(self, request_id: str) -> RequestHandle | None: ...

    def snapshot(self) -> EngineSnapshot: ...


class ModelView:
    """One model of a set, shaped like a single Engine for the code that serves a request:
    submit goes to that model; the rest (snapshot, cancel, handle) is the whole set's."""

    def __init__(self, models: ServingSet, name: str, keep_alive: object,
                 admin: bool = True) -> None:
        self.models, self.name, self.keep_alive, self.admin = models, name, keep_alive, admin
        self.arrival: Arrival | None = None  # announced by arrive(), until submitted

    def arrive(self, owner: str, owner_limit: int | None = None) -> None:
        """Announce the request now, before its prompt is ready (ModelSet.arrive); raises
        LoadRefused, QueueFull."""
        self.arrival = self.models.arrive(self.name, owner, self.admin, owner_limit)

    def leave(self) -> None:
        """The announced request will not be submitted: no longer listed."""
        arrival, self.arrival = self.arrival, None
        if arrival is not None:
            self.models.withdraw(arrival)

    @property
    def alive(self) -> bool:
        return self.models.alive

    @property
    def config(self) -> EngineConfig:
        return self.models.table.config_of(self.name)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.models.tokenizer(self.name)

    @property
    def task(self) -> str | None:
        """"generate", "embed" or "score" (a cross-encoder), loaded or not (None: not
        known until it loads)."""
        return self.models.table.task_of(self.name)

    def submit(self, prompt_ids: list[int], params: SamplingParams, owner: str = "local",
               request_id: str | None = None, owner_limit: int | None = None,
               reasoning: Reasoning | None = None,
               images: tuple[ImageInput, ...] = ()) -> RequestHandle:
        arrival, self.arrival = self.arrival, None  # the first submit is the announced one
        return self.models.submit(prompt_ids, params, owner, request_id, owner_limit,
                                  reasoning, self.name, self.keep_alive, self.admin, arrival,
                                  images)

    @property
    def vision(self) -> VisionConfig | None:
        """The model's image side: the loaded engine's, else read from its files before it
        loads (None: text only)."""
        with self.models.table.lock:
            entry = self.models.table.entries[self.name]
        vision: VisionConfig | None = entry.engine.vision if entry.engine is not None \
            else entry.source.vision
        return vision

    @property
    def takes_images(self) -> bool:
        return self.vision is not None

    def check_constraint(self, constraint: Constraint) -> Constraint:
        """Checked by the loaded engine's compiler, else by one built from the tokenizer
        (both share the model's compiled grammars): the constraint, compiled."""
        engine = self.models.table.engine_of(self.name)
        if engine is not None:
            return engine.check_constraint(constraint)
        return self.models.grammars(self.name).check(constraint)

    # the rest is the whole set's
    def start(self) -> object:
        return self.models.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.models.stop(timeout)

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        return self.models.cancel(request_id, reason)

    def handle(self, request_id: str) -> RequestHandle | None:
        return self.models.handle(request_id)

    def snapshot(self) -> EngineSnapshot:
        return self.models.snapshot()

    def live_ids(self, owner: str | None = None) -> list[str]:
        return self.models.table.live_ids(owner)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        return self.models.table.wait_idle(timeout)

    def reconfigure(self, policy: str | None = None, admission: str | None = None) -> None:
        self.models.table.reconfigure(policy, admission)

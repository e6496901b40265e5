"""Several models in one process: an Engine per loaded model, loading on demand on a thread of
its own, a memory budget (LRU idle model unloaded first) and keep_alive (design: see
docs/layout.md, engine.models).

Callers use it like one Engine (submit, cancel, snapshot, handle) plus the model's name. A
request for a model not loaded is accepted at once: it waits, with the reason `loading`
(or `memory` while the budget is held by busy models), and is handed to the model's engine
when the load is done. A monitor thread ("ferry-models") starts loads and unloads; engines
share the CPU through FairTurns.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.models.budget import Budget
from engine.models.entry import ModelEntry, ModelEvent, ModelInfo
from engine.models.keep_alive import DEFAULT_KEEP_ALIVE
from engine.models.monitor import Monitor
from engine.models.pending import Arrival, Pending, empty_snapshot, merge
from engine.models.sharing import KEEP, Sharing, SharingRules
from engine.models.source import LoadedModel, ModelSource
from engine.models.turns import FairTurns
from engine.models.views import ModelTable, ModelView
from engine.runtime.engine import QueueFull
from engine.runtime.handle import RequestHandle
from engine.runtime.snapshot import EngineSnapshot
from engine.scheduling.request import RequestError, SamplingParams, new_request_id
from engine.text.reasoning import Reasoning
from engine.vision import ImageInput

if TYPE_CHECKING:
    from engine.execution.text.tokenizer import Tokenizer
    from engine.structured.compiler import GrammarCompiler

log = logging.getLogger(__name__)
__all__ = ["KEEP", "ModelSet", "UnknownModel"]


class UnknownModel(LookupError):
    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(f"the model {name!r} is not served here; known: {', '.join(known)}")
        self.name, self.known = name, tuple(known)


class ModelSet(Monitor, Sharing):
    def __init__(self, sources: Sequence[ModelSource], config: EngineConfig, budget: Budget,
                 keep_alive: float | None = DEFAULT_KEEP_ALIVE,
                 preloaded: Mapping[str, tuple[LoadedModel, Tokenizer]] | None = None,
                 clock: Callable[[], float] = time.monotonic, poll: float = 0.2,
                 rules: SharingRules | None = None) -> None:
        if not sources:
            raise ValueError("a model set needs at least one model")
        self.budget = budget
        self.rules = rules or SharingRules()  # what normal users' requests may load
        self.clock = clock
        self.turns = FairTurns()
        self._poll = poll
        self._keep_alive = keep_alive  # the models other than the default (and those added)
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._grammar_lock = threading.Lock()
        self._merged: tuple[object, EngineSnapshot, object] | None = None
        self._compilers: dict[str, GrammarCompiler] = {}
        self.events: collections.deque[ModelEvent] = collections.deque(maxlen=40)
        # the default model (first) stays loaded unless a request's keep_alive says otherwise
        self.table = ModelTable(config, {s.name: ModelEntry(s, configured_keep_alive=None,
                                                            admin_keep_alive=None)
                                         for s in sources})
        for entry in list(self.table.entries.values())[1:]:
            entry.admin_keep_alive = entry.configured_keep_alive = keep_alive
        for name, (loaded, tokenizer) in (preloaded or {}).items():
            entry = self.table.entries[name]
            entry.tokenizer = tokenizer
            self._install(entry, loaded)

    @property
    def config(self) -> EngineConfig:
        """The default model's config: policy and limits for all."""
        return self.table.config

    @property
    def default(self) -> str:
        return next(iter(self.table.entries))

    @property
    def names(self) -> list[str]:
        return list(self.table.entries)

    def resolve(self, model: str | None) -> str:
        """The served model's name for a request's `model` (missing or empty: the default);
        raises UnknownModel."""
        if not model:
            return self.default
        if model not in self.table.entries:
            raise UnknownModel(model, self.names)
        return model

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> ModelSet:
        for entry in self.table.entries.values():
            if entry.engine is not None and not entry.engine.alive:
                entry.engine.start()
        self._thread = threading.Thread(target=self._run, name="ferry-models", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self.table.lock:
            self._stopping = True
            pending = [p for e in self.table.entries.values() for p in e.pending]
            for e in self.table.entries.values():
                e.pending = []
            engines = [e.engine for e in self.table.entries.values() if e.engine is not None]
        for p in pending:
            p.end(self.clock(), "cancelled", "the server is shutting down")
        for engine in engines:
            engine.stop(timeout)
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- requests ----------------------------------------------------------------------------
    def tokenizer(self, model: str | None = None) -> Tokenizer:
        """The model's tokenizer, opened on first use and kept (loaded or not)."""
        entry = self.table.entries[self.resolve(model)]
        with entry.tokenizer_lock:
            if entry.tokenizer is None:
                entry.tokenizer = entry.source.open_tokenizer()
            return entry.tokenizer

    def submit(self, prompt_ids: list[int], params: SamplingParams, owner: str = "local",
               request_id: str | None = None, owner_limit: int | None = None,
               reasoning: Reasoning | None = None, model: str | None = None,
               keep_alive: object = KEEP, admin: bool = True,
               arrival: Arrival | None = None,
               images: tuple[ImageInput, ...] = ()) -> RequestHandle:
        """Queue a request for `model` (None: the default); `keep_alive`: seconds the model
        stays loaded once idle after it (None: always; the rules in engine.models.sharing
        say whose counts); `admin`: an admin's request (local mode: every one); `arrival`:
        what arrive() gave for this request (it keeps that id). Raises LoadRefused, QueueFull,
        RequestError."""
        if not self.alive:
            raise RuntimeError("the model set is not running")
        entry = self.table.entries[self.resolve(model)]
        tokenizer = self.tokenizer(entry.name)
        if arrival is not None:
            request_id = request_id or arrival.id
        with self.table.lock:
            ended = self._take_arrival(entry, arrival)
            if ended is not None:  # cancelled (or its load failed) while its prompt was made
                handle = RequestHandle(request_id or new_request_id(), owner, list(prompt_ids),
                                       tokenizer, params.stop, self.cancel, reasoning)
                failed = entry.name if ended[0] == "error" else None  # only a load fails it
                Pending(handle, list(prompt_ids), params, owner, owner_limit, reasoning,
                        self.clock()).end(self.clock(), *ended, unavailable=failed)
                return handle
            if owner_limit is not None and self.table.owner_live(owner) >= owner_limit:
                # across the set: requests waiting for a load count as much as running ones
                raise QueueFull(f"{owner} already has {owner_limit} requests queued or running")
            loaded = entry.state == "loaded" and entry.engine is not None
            if not loaded and arrival is None:
                self._check_load(entry, admin)
            self._join(entry, owner)
            self._keep(entry, owner, admin, keep_alive)
            entry.last_used = self.clock()
            if loaded:
                assert entry.engine is not None
                return entry.engine.submit(prompt_ids, params, owner, request_id, owner_limit,
                                           reasoning, images=images)
            if entry.waiting >= self.table.config.max_waiting:
                raise QueueFull(f"{entry.waiting} requests already wait for "
                                f"{entry.name} to load")
            handle = RequestHandle(request_id or new_request_id(), owner, list(prompt_ids),
                                   tokenizer, params.stop, self.cancel, reasoning)
            entry.pending.append(Pending(handle, list(prompt_ids), params, owner, owner_limit,
                                         reasoning, self.clock(), admin, images))
        self._wake.set()
        return handle

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        with self.table.lock:
            if self._cancel_arrival(request_id):
                return True
            for entry in self.table.entries.values():
                for p in entry.pending:
                    if p.handle.id == request_id:
                        entry.pending.remove(p)
                        break
                else:
                    if entry.engine is not None and entry.engine.cancel(request_id, reason):
                        return True
                    continue
                break
            else:
                return False
        p.end(self.clock(), "stop" if reason == "stop" else "cancelled", None)
        return True

    def handle(self, request_id: str) -> RequestHandle | None:
        with self.table.lock:
            for entry in self.table.entries.values():
                for p in entry.pending:
                    if p.handle.id == request_id:
                        return p.handle
                found = entry.engine.handle(request_id) if entry.engine else None
                if found is not None:
                    return found
        return None

    def snapshot(self) -> EngineSnapshot:
        """Every model's requests in one snapshot; the same object while nothing changed
        (the dashboard pushes only on a new one)."""
        now = self.clock()
        with self.table.lock:
            engines = [(e.name, e.engine) for e in self.table.entries.values() if e.engine]
            entries = list(self.table.entries.values())
            pending = [v for e in entries for v in self.table.pending_views(e, now)]
            states = tuple((e.state, e.error, e.memory_wait) for e in entries)
        snaps = [(name, engine.snapshot()) for name, engine in engines]
        # ids of the models' snapshots: the cache keeps them alive, so an id is not reused
        key = (tuple(id(s) for _, s in snaps), states,
               tuple((v.id, v.reason.text if v.reason else "") for v in pending))
        if self._merged is not None and self._merged[0] == key:
            return self._merged[1]
        base = next((s for n, s in snaps if n == self.default), None) or \
            (snaps[0][1] if snaps else empty_snapshot(self.table.config, now))
        merged = merge(base, snaps, pending, now)
        self._merged = (key, merged, snaps)
        return merged

    def serving(self, model: str | None, keep_alive: object = KEEP,
                admin: bool = True) -> ModelView:
        """`model` (None: the default) shaped like one Engine, for one request's handling;
        `admin`: whether the one asking is an admin (engine.models.sharing's rules)."""
        return ModelView(self, self.resolve(model), keep_alive, admin)

    def grammars(self, model: str) -> GrammarCompiler:
        """A grammar compiler from the model's tokenizer (checks before it is loaded)."""
        from engine.structured.compiler import GrammarCompiler

        with self._grammar_lock:
            if model not in self._compilers:
                try:
                    self._compilers[model] = GrammarCompiler(self.tokenizer(model).hf, None)
                except (ValueError, TypeError, RuntimeError) as exc:
                    raise RequestError("constrained output is unavailable with this model's "
                                       f"tokenizer: {exc}") from exc
            return self._compilers[model]

    # -- the read side (the table's) ---------------------------------------------------------
    def models(self) -> list[ModelInfo]:
        return self.table.models()

    def opened_tokenizer(self, model: str) -> Tokenizer | None:
        return self.table.opened_tokenizer(model)

    def live_ids(self, owner: str | None = None) -> list[str]:
        return self.table.live_ids(owner)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        return self.table.wait_idle(timeout)

    def reconfigure(self, policy: str | None = None, admission: str | None = None) -> None:
        self.table.reconfigure(policy, admission)

    def model_snapshots(self) -> list[tuple[str, EngineSnapshot | None]]:
        return self.table.model_snapshots()

    def config_of(self, model: str) -> EngineConfig:
        return self.table.config_of(model)

    # -- admin -------------------------------------------------------------------------------
    def add(self, source: ModelSource) -> bool:
        """Serve one more model (found on disk after the start), not loaded until asked for;
        False when the name is taken. The dict is replaced, never changed in place, so
        readers iterating the old one are not disturbed."""
        with self.table.lock:
            if source.name in self.table.entries:
                return False
            entry = ModelEntry(source, configured_keep_alive=self._keep_alive,
                               admin_keep_alive=self._keep_alive)
            self.table.entries = {**self.table.entries, source.name: entry}
        return True

    def load(self, model: str) -> None:
        """Load `model` now (unloading idle ones if the budget needs room)."""
        with self.table.lock:
            self.table.entries[self.resolve(model)].wanted = True
        self._wake.set()

    def unload(self, model: str) -> bool:
        """Unload `model` now; False when it has requests (or is loading) or is not loaded."""
        with self.table.lock:
            entry = self.table.entries[self.resolve(model)]
            if entry.state != "loaded" or entry.busy:
                return False
            entry.state = "unloading"
        self._unload(entry, "unloaded by an admin")
        return True

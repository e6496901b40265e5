"""The model set's monitor thread ("ferry-models"): it starts loads (each on a thread of its
own, so a load never stalls the engines already running) and unloads (idle past keep_alive,
or the least recently used idle model when the budget needs room), and records the events."""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.models.budget import Budget, Resident
from engine.models.entry import ModelEntry, ModelEvent
from engine.models.memory import release_memory
from engine.models.source import LoadedModel
from engine.models.turns import FairTurns
from engine.runtime.engine import Engine, QueueFull
from engine.scheduling.request import RequestError

if TYPE_CHECKING:
    from engine.execution.text.tokenizer import Tokenizer
    from engine.models.views import ModelTable

log = logging.getLogger(__name__)


class Monitor:
    """Loading and unloading for ModelSet (split out to keep one concern per file)."""

    budget: Budget
    clock: Callable[[], float]
    turns: FairTurns
    events: collections.deque[ModelEvent]
    table: ModelTable
    _wake: threading.Event
    _stopping: bool
    _poll: float

    def tokenizer(self, model: str | None = None) -> Tokenizer:
        raise NotImplementedError

    # -- the monitor thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._poll)
            self._wake.clear()
            if not self._stopping:
                try:
                    self._tick()
                except Exception:  # never let the monitor die: loads would stop
                    log.exception("model set tick failed")

    def _tick(self) -> None:
        now = self.clock()
        unload: list[tuple[ModelEntry, str]] = []
        load: list[ModelEntry] = []
        unload_refused: list[tuple[ModelEntry, str]] = []
        with self.table.lock:
            for e in self.table.entries.values():
                if e.state != "loaded":
                    continue
                if e.busy:
                    e.last_used = now
                elif e.keep_alive is not None and now - e.last_used >= e.keep_alive:
                    e.state = "unloading"
                    unload.append((e, f"idle for {e.keep_alive:g} s (keep_alive)"))
            waiting = sorted((e for e in self.table.entries.values()
                              if e.state == "unloaded" and e.demanded),
                             key=lambda e: min([p.arrival for p in e.pending]
                                               + [a.arrival for a in e.arrivals], default=now))
            default = next(iter(self.table.entries))
            for e in waiting:
                need = e.measured or e.source.size
                refused = self.budget.refusal(e.name, need, bool(e.measured))
                if refused is not None:
                    unload_refused.append((e, refused))
                    continue
                # only an admin's load may unload the default model to make room
                keep = not e.admin_demand
                resident = [Resident(r.name, r.size, r.busy or r in load
                                     or (keep and r.name == default), r.last_used)
                            for r in self.table.entries.values()
                            if r.state in ("loaded", "loading")]
                victims = self.budget.make_room(resident, need)
                if victims is None:
                    busy = ", ".join(r.name for r in resident if r.busy)
                    e.memory_wait = f"memory: {len(resident)} models loaded, " \
                        f"busy: {busy or 'none'}" + \
                        (f" (the default {default} stays)"
                         if keep and any(r.name == default for r in resident) else "")
                    continue
                for name in victims:
                    self.table.entries[name].state = "unloading"
                    unload.append((self.table.entries[name], f"making room for {e.name} (least "
                                   "recently used)"))
                e.state, e.loading_since, e.memory_wait = "loading", now, None
                # loaded for one normal user alone: that user's keep_alive may shorten it
                owners = e.demand_owners()
                e.users = owners
                e.loaded_for = owners.pop() if len(owners) == 1 and not e.admin_demand \
                    else None
                if e.loaded_for is None:
                    e.user_keep_alive = None
                load.append(e)
        for entry, why in unload_refused:
            self._fail(entry, why)
        for entry, why in unload:
            self._unload(entry, why)
        for entry in load:
            self._event(entry.name, "loading", f"loading {entry.name}")
            threading.Thread(target=self._load, args=(entry,), daemon=True,
                             name=f"ferry-load-{entry.name}").start()

    def _load(self, entry: ModelEntry) -> None:
        started = self.clock()
        try:
            tokenizer = self.tokenizer(entry.name)
            loaded = entry.source.load()
        except Exception as exc:  # a bad file: its requests fail, the others go on
            log.exception("loading %s failed", entry.name)
            self._fail(entry, f"{type(exc).__name__}: {exc}")
            return
        with self.table.lock:
            if self._stopping:
                return
            entry.tokenizer = tokenizer
            self._install(entry, loaded)
            assert entry.engine is not None
            entry.engine.start()
            pending, entry.pending = entry.pending, []
            for p in pending:
                try:
                    entry.engine.submit(p.prompt_ids, p.params, p.owner, p.handle.id,
                                        p.owner_limit, p.reasoning, handle=p.handle,
                                        images=p.images)
                except (RequestError, QueueFull) as exc:
                    p.end(self.clock(), "error", str(exc))
        self._event(entry.name, "loaded",
                    f"loaded {entry.name} in {self.clock() - started:.1f} s")
        self._settle(entry)

    def _settle(self, entry: ModelEntry) -> None:
        """The load's measured size may exceed the estimate it was admitted with: idle
        models (least recently used first) make room for the difference."""
        with self.table.lock:
            others = [Resident(r.name, r.size, r.busy, r.last_used)
                      for r in self.table.entries.values()
                      if r is not entry and r.state == "loaded"]
            victims = self.budget.make_room(others, entry.size) or []
            for name in victims:
                self.table.entries[name].state = "unloading"
        for name in victims:
            self._unload(self.table.entries[name], f"making room for {entry.name} "
                         f"({entry.size / 1e9:.2f} GB as measured after its load)")

    def _fail(self, entry: ModelEntry, error: str) -> None:
        """The load did not happen (a bad file, or more memory than the budget): its
        requests, waiting or announced, end with the reason, naming the model as
        unavailable; the other models go on."""
        failed = f"loading {entry.name} failed: {error}"
        with self.table.lock:
            entry.state, entry.wanted = "unloaded", False
            entry.loaded_for, entry.users = None, set()
            entry.error = error
            pending, entry.pending = entry.pending, []
            for arrival in entry.arrivals:  # their submits end with the same error
                arrival.ended = ("error", failed)
            entry.arrivals = []
        for p in pending:
            p.end(self.clock(), "error", failed, unavailable=entry.name)
        self._event(entry.name, "failed", failed)

    def _install(self, entry: ModelEntry, loaded: LoadedModel) -> None:
        # the policy and admission order are the set's (an admin may have changed them)
        config = dataclasses.replace(loaded.config, policy=self.table.config.policy,
                                     admission=self.table.config.admission)
        entry.engine = Engine(config, loaded.executor, entry.tokenizer, turns=self.turns)
        entry.state, entry.error, entry.wanted = "loaded", None, False
        entry.size = loaded.size or entry.source.size
        entry.measured = loaded.size  # what it really cost: the budget's figure next time
        entry.runs = loaded.runs
        entry.last_used = self.clock()

    def _unload(self, entry: ModelEntry, why: str) -> None:
        engine = entry.engine
        if engine is not None:
            engine.stop()
        with self.table.lock:
            entry.engine = None
        del engine
        release_memory()  # the weights and KV pool go back to the system
        self._event(entry.name, "unloaded", f"unloaded {entry.name}: {why}")
        with self.table.lock:  # after the event: whoever sees "unloaded" finds the event too
            entry.state, entry.size = "unloaded", 0
            entry.loaded_for, entry.users, entry.user_keep_alive = None, set(), None
        self._wake.set()

    def _event(self, model: str, kind: str, text: str) -> None:
        log.info("%s", text)
        self.events.append(ModelEvent(time.time(), model, kind, text))  # type: ignore[arg-type]

"""Who decides what is loaded (shared mode): a normal user's request may load a model only
where the rules let it, never evicts the default model, and its `keep_alive` only shortens the
life of a model that user alone caused to load. Admin requests (and local mode, where the one
user is the admin) decide as Ollama's do.

Also the arrivals: a request announced before its prompt is ready (its model's tokenizer may
take seconds to open), listed as waiting for its model from that moment on, and starting the
load at once.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from engine.models.budget import Budget, Resident
from engine.models.entry import ModelEntry
from engine.models.pending import Arrival
from engine.runtime.engine import QueueFull
from engine.scheduling.request import FinishReason, new_request_id

if TYPE_CHECKING:
    from engine.models.views import ModelTable

KEEP = object()  # submit's keep_alive when the request names none


@dataclass(frozen=True, slots=True)
class SharingRules:
    # a normal user's request for a model not loaded loads it (off: only an admin's does)
    users_load: bool = True


class LoadRefused(Exception):
    """A normal user's request would load a model the rules keep it from loading.
    `kind`: not_loaded (loading on demand is for admins) or no_room (only unloading the
    default model would make room)."""

    def __init__(self, model: str, message: str,
                 kind: Literal["not_loaded", "no_room"]) -> None:
        super().__init__(message)
        self.model, self.kind = model, kind


class Sharing:
    """The rules and the arrivals for ModelSet (split out to keep one concern per file)."""

    budget: Budget
    rules: SharingRules
    clock: Callable[[], float]
    table: ModelTable
    _wake: threading.Event

    def resolve(self, model: str | None) -> str:
        raise NotImplementedError

    @property
    def default(self) -> str:
        return next(iter(self.table.entries))

    # -- arrivals ----------------------------------------------------------------------------
    def arrive(self, model: str | None, owner: str, admin: bool = True,
               owner_limit: int | None = None) -> Arrival | None:
        """Announce a request for `model` before its prompt is ready: when the model is not
        loaded, the request is listed as waiting for it (reason `loading`) and its load
        starts now. None when the model is loaded (nothing to wait for). Raises LoadRefused
        (the rules), QueueFull (the user's limit, the queue bound)."""
        entry = self.table.entries[self.resolve(model)]
        with self.table.lock:
            if entry.state == "loaded" and entry.engine is not None:
                return None
            self._check_load(entry, admin)
            if owner_limit is not None and self.table.owner_live(owner) >= owner_limit:
                raise QueueFull(f"{owner} already has {owner_limit} requests queued or running")
            if entry.waiting >= self.table.config.max_waiting:
                raise QueueFull(f"{entry.waiting} requests already wait for {entry.name} to "
                                "load")
            arrival = Arrival(new_request_id(), owner, admin, self.clock())
            entry.arrivals.append(arrival)
            self._join(entry, owner)
        self._wake.set()
        return arrival

    def withdraw(self, arrival: Arrival) -> None:
        """The announced request will not be submitted (refused, or its client left)."""
        with self.table.lock:
            for entry in self.table.entries.values():
                if arrival in entry.arrivals:
                    entry.arrivals.remove(arrival)
        self._wake.set()

    def _take_arrival(self, entry: ModelEntry, arrival: Arrival | None
                      ) -> tuple[FinishReason, str | None] | None:
        """Under the lock: the arrival is submitted now; how it ended already (cancelled,
        or its load failed), else None."""
        if arrival is None:
            return None
        if arrival in entry.arrivals:
            entry.arrivals.remove(arrival)
        return arrival.ended

    def _cancel_arrival(self, request_id: str) -> bool:
        """Under the lock: cancel an announced request (its submit then ends at once)."""
        for entry in self.table.entries.values():
            for arrival in entry.arrivals:
                if arrival.id == request_id:
                    entry.arrivals.remove(arrival)
                    arrival.ended = ("cancelled", None)
                    return True
        return False

    # -- the rules ---------------------------------------------------------------------------
    def _check_load(self, entry: ModelEntry, admin: bool) -> None:
        """Under the lock: raise LoadRefused when this request would start a load that a
        normal user may not start. Joining a load already under way (or asked for by
        someone allowed to) is always fine."""
        if admin or entry.state in ("loaded", "loading") or entry.demanded:
            return
        name = entry.name
        if not self.rules.users_load:
            raise LoadRefused(name, f"the model {name!r} is not loaded, and on this server "
                              "only an admin loads models: ask an admin to load it, or "
                              "use a loaded model", "not_loaded")
        if self._blocked_by_default(entry):
            raise LoadRefused(name, f"the model {name!r} cannot be loaded now: the memory "
                              f"budget (at most {self.budget.max_loaded} loaded, "
                              f"{self.budget.max_memory / 2**30:.1f} GiB) is full, and "
                              f"making room would unload the default model {self.default!r}, "
                              "which only an admin may do", "no_room")

    def _blocked_by_default(self, entry: ModelEntry) -> bool:
        """Whether `entry` can never fit while the default model stays, even once every
        other model is idle."""
        if entry.name == self.default:
            return False
        resident = [Resident(r.name, r.size, r.name == self.default, r.last_used)
                    for r in self.table.entries.values()
                    if r is not entry and r.state in ("loaded", "loading")]
        return self.budget.make_room(resident, entry.source.size) is None

    def _join(self, entry: ModelEntry, owner: str) -> None:
        """Under the lock: `owner` uses the model; once someone other than the user it was
        loaded for does, that user's shorter keep_alive no longer applies."""
        entry.users.add(owner)
        if not entry.alone(owner):
            entry.user_keep_alive = None

    def _keep(self, entry: ModelEntry, owner: str, admin: bool, asked: object) -> None:
        """Under the lock: a request's keep_alive. An admin's sets the model's (naming
        none restores the configured one, as Ollama does). A normal user's may only shorten
        the life of a model loaded for that user alone, and only below the admin's; anything
        else (the default model's, above all) leaves the model's lifetime as it is."""
        if admin:
            entry.admin_keep_alive = entry.configured_keep_alive if asked is KEEP \
                else asked  # type: ignore[assignment]
            entry.user_keep_alive = None
            return
        if entry.name == self.default or not entry.alone(owner):
            return  # the default model is everyone's, even when one user brought it back
        limit = entry.admin_keep_alive
        shorter = isinstance(asked, float | int) and (limit is None or asked < limit)
        entry.user_keep_alive = float(asked) if shorter else None  # type: ignore[arg-type]

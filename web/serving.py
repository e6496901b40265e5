"""What the web layer needs from the thing that serves requests, as protocols.

`Serving` is met by the single Engine facade, by engine.ModelSet (several models) and by
one model of a set (engine.ModelView), and by the gateway of upstream mode (its handles and
limits are its own types, hence the loose return types). `ModelCatalog` is what a server of
several models adds: the list, the per-request view of one model (`ModelServing`: a request
announced before its prompt is ready), load and unload.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engine import EngineSnapshot, ModelEvent, ModelInfo, SamplingParams

if TYPE_CHECKING:
    from engine import Tokenizer


class Serving(Protocol):
    @property
    def alive(self) -> bool: ...

    @property
    def config(self) -> Any: ...  # EngineConfig (the gateway: its limits, same field names)

    def start(self) -> object: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def submit(self, prompt_ids: list[int], params: SamplingParams, owner: str = "local",
               request_id: str | None = None, owner_limit: int | None = None) -> Any: ...

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool: ...

    def snapshot(self) -> EngineSnapshot: ...

    def handle(self, request_id: str) -> Any: ...  # the live request's handle, or None

    def live_ids(self, owner: str | None = None) -> list[str]: ...

    def reconfigure(self, policy: str | None = None, admission: str | None = None) -> None: ...


class ModelServing(Serving, Protocol):
    """One model of a set, for one request (engine.ModelView)."""

    def arrive(self, owner: str, owner_limit: int | None = None) -> None: ...

    def leave(self) -> None: ...


@runtime_checkable
class ModelCatalog(Protocol):
    """Several models in one server (engine.ModelSet)."""

    events: Sequence[ModelEvent]  # the latest loads and unloads

    @property
    def default(self) -> str: ...

    @property
    def names(self) -> list[str]: ...

    def resolve(self, model: str | None) -> str: ...  # raises engine.UnknownModel

    def serving(self, model: str | None, keep_alive: object = ...,
                admin: bool = ...) -> ModelServing: ...

    def tokenizer(self, model: str | None = None) -> Tokenizer: ...

    def opened_tokenizer(self, model: str) -> Tokenizer | None: ...  # never waits to open

    def models(self) -> list[ModelInfo]: ...

    def model_snapshots(self) -> list[tuple[str, EngineSnapshot | None]]: ...

    def load(self, model: str) -> None: ...

    def unload(self, model: str) -> bool: ...

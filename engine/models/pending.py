"""Requests that wait for their model to load (or for memory to load it), and the merged
snapshot: every model's requests in one EngineSnapshot, each view naming its model."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.runtime.events import FinalEvent, Timings, Usage
from engine.runtime.handle import RequestHandle
from engine.runtime.snapshot import EngineSnapshot, KVView, MetricsView, RequestView
from engine.scheduling.admission import WaitReason
from engine.scheduling.request import FinishReason, SamplingParams
from engine.text.reasoning import Reasoning
from engine.vision import ImageInput


@dataclass(eq=False, slots=True)
class Arrival:
    """A request announced before its prompt is ready (its model's tokenizer opening): listed
    as waiting for the model from its first moment, and a demand for its load."""

    id: str
    owner: str
    admin: bool
    arrival: float  # when it was announced (the set's clock)
    # how it ended before its submit (cancelled, or its model failed to load): the submit
    # then ends at once, the same way
    ended: tuple[FinishReason, str | None] | None = None

    def view(self, model: str, now: float, reason: WaitReason, position: int) -> RequestView:
        return RequestView(
            id=self.id, owner=self.owner, state="waiting", position=position, reason=reason,
            slot=None, prompt_tokens=0, cached_tokens=0, prefill_done=0, chunk=0,
            num_chunks=1, output_tokens=0, max_tokens=0, arrival=self.arrival,
            waited=now - self.arrival, ttft=None, itl=None, model=model)


@dataclass(slots=True)
class Pending:
    handle: RequestHandle
    prompt_ids: list[int]
    params: SamplingParams
    owner: str
    owner_limit: int | None
    reasoning: Reasoning | None
    arrival: float
    admin: bool = True  # an admin's request (shared mode): its load may evict the default
    images: tuple[ImageInput, ...] = ()  # a vision model's images, placed in the prompt

    def view(self, model: str, now: float, reason: WaitReason,
             position: int) -> RequestView:
        return RequestView(
            id=self.handle.id, owner=self.owner, state="waiting", position=position,
            reason=reason, slot=None, prompt_tokens=len(self.prompt_ids), cached_tokens=0,
            prefill_done=0, chunk=0, num_chunks=1, output_tokens=0,
            max_tokens=self.params.max_tokens, arrival=self.arrival,
            waited=now - self.arrival, ttft=None, itl=None,
            constraint=self.params.constraint.kind if self.params.constraint else None,
            model=model)

    def end(self, now: float, reason: FinishReason, error: str | None,
            unavailable: str | None = None) -> None:
        """Finish without running (cancelled, or the load failed: `unavailable` names the
        model, in the final event's extra "model_unavailable", for an answer that names it)."""
        waited = now - self.arrival
        extra: dict[str, object] = {} if unavailable is None else \
            {"model_unavailable": unavailable}
        self.handle.put(FinalEvent(reason, Usage(len(self.prompt_ids), 0),
                                   Timings(waited, None, None, waited), error, extra))


def named(views: Sequence[RequestView], model: str) -> tuple[RequestView, ...]:
    return tuple(dataclasses.replace(v, model=model) for v in views)


def empty_snapshot(config: EngineConfig, now: float) -> EngineSnapshot:
    """What a set with no model loaded shows."""
    return EngineSnapshot(
        time=now, busy=False, policy=config.policy, admission=config.admission,
        max_running=config.max_running, max_prefill_tokens=config.max_prefill_tokens,
        page_size=config.page_size, waiting=(), running=(), slots=(),
        kv=KVView(0, 0, 0, 0, 0), rounds=(), prefix_cache=config.prefix_cache,
        metrics=MetricsView(0.0, 0.0, None, None, None, None, 0, 0, 0, 0, 0, 0))


def merge(base: EngineSnapshot, models: Sequence[tuple[str, EngineSnapshot]],
          pending: Sequence[RequestView], now: float) -> EngineSnapshot:
    """One snapshot over every model: requests from all (named), slots side by side, the KV
    pools summed; the rounds and metrics stay the default model's (`base`)."""
    waiting = tuple(pending) + tuple(v for n, s in models for v in named(s.waiting, n))
    running = tuple(v for n, s in models for v in named(s.running, n))
    finished = tuple(v for n, s in models for v in named(s.recent_finished, n))
    kvs = [s.kv for _, s in models]
    kv = KVView(*(sum(getattr(k, f) for k in kvs)
                  for f in ("total", "used", "reserved", "cached", "free")))
    return dataclasses.replace(
        base, time=now, busy=any(s.busy for _, s in models) or bool(pending),
        max_running=sum(s.max_running for _, s in models) or base.max_running,
        waiting=waiting, running=running, slots=tuple(x for _, s in models for x in s.slots),
        kv=kv, recent_finished=finished)

"""Builds the immutable EngineSnapshot from scheduler state (on the scheduler thread)."""
from __future__ import annotations

from engine.runtime.core import RoundRecord
from engine.runtime.metrics import MetricsRecorder
from engine.runtime.snapshot import EngineSnapshot, KVView, RequestView, RoundView
from engine.scheduling.admission import WaitReason
from engine.scheduling.request import Request, RequestState
from engine.scheduling.scheduler import Scheduler


def request_view(req: Request, now: float, budget: int, position: int | None = None,
                 reason: WaitReason | None = None) -> RequestView:
    uncached = req.prompt_len - req.num_cached
    admitted = req.admitted_at
    return RequestView(
        id=req.id, owner=req.owner, state=req.state.value, position=position, reason=reason,
        slot=req.slot, prompt_tokens=req.prompt_len, cached_tokens=req.num_cached,
        # num_computed counts decoded positions too: the prompt part only
        prefill_done=min(req.num_computed, req.prompt_len)
        if req.state is not RequestState.WAITING else 0,
        chunk=req.num_chunks, num_chunks=max(1, -(-uncached // budget)),
        output_tokens=req.num_outputs, max_tokens=req.params.max_tokens, arrival=req.arrival,
        waited=(admitted if admitted is not None else now) - req.arrival,
        ttft=None if req.first_token_at is None else req.first_token_at - req.arrival,
        itl=req.itl, finish_reason=req.finish_reason,
        total=None if req.finished_at is None else req.finished_at - req.arrival,
        constraint=req.params.constraint.kind if req.params.constraint else None)


def round_view(index: int, r: RoundRecord) -> RoundView:
    return RoundView(index, r.batch.phase,
                     tuple((it.request.id, it.num_tokens) for it in r.batch.items),
                     tuple(q.id for q in r.finished), r.started, r.duration, r.schedule_time,
                     tuple(it.request.id for it in r.batch.items if it.is_decode),
                     tuple(q.id for q in r.batch.encodes))


def build_snapshot(scheduler: Scheduler, metrics: MetricsRecorder,
                   rounds: tuple[RoundView, ...], now: float,
                   finished: tuple[RequestView, ...] = ()) -> EngineSnapshot:
    cfg = scheduler.config
    budget = cfg.max_prefill_tokens
    reasons = scheduler.wait_reasons() if scheduler.waiting else {}
    waiting = tuple(request_view(r, now, budget, i + 1, reasons.get(r.id))
                    for i, r in enumerate(scheduler.ordered_waiting()))
    admitted = sorted(scheduler.running + scheduler.chunked, key=lambda r: r.arrival)
    running = tuple(request_view(r, now, budget) for r in admitted)
    kv = scheduler.kv
    reserved = min(scheduler.reservations(), kv.free + kv.evictable)
    return EngineSnapshot(
        time=now, busy=scheduler.has_work, policy=cfg.policy, admission=cfg.admission,
        speculative=cfg.speculative if scheduler.drafter is not None else "off",
        prefix_cache=kv.cache is not None,
        max_running=cfg.max_running, max_prefill_tokens=cfg.max_prefill_tokens,
        page_size=cfg.page_size, waiting=waiting, running=running,
        slots=tuple(scheduler.slots.owners),
        # The bar: used | reserved | cached | free. Reservations come out of free space
        # first, then out of the evictable cache (which admission counts as available).
        kv=KVView(total=kv.total, used=kv.held, reserved=reserved,
                  cached=kv.evictable - max(0, reserved - kv.free),
                  free=max(0, kv.free - reserved)),
        rounds=rounds,
        metrics=metrics.view(now), recent_finished=finished,
        local_kv=local_view(scheduler), sliding_window=cfg.sliding_window)


def local_view(scheduler: Scheduler) -> KVView | None:
    """The local layers' pool: used | reserved | free (it caches nothing)."""
    local = scheduler.local
    if local is None:
        return None
    reserved = min(scheduler.local_reservations(), local.free)
    return KVView(total=local.total, used=local.held, reserved=reserved, cached=0,
                  free=local.free - reserved)

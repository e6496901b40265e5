"""The gateway's state as the dashboard reads it: an EngineSnapshot (so the existing board
shows Ferry's queue: waiting with reasons, running, a slot per in-flight place) and a
GatewayView of the upstreams and which requests each holds; /metrics reads the same view
(GatewayCollector)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine import EngineSnapshot, KVView, MetricsView, RequestView, WaitReason
from web.gateway.queue import GatewayRequest, served
from web.gateway.upstream import Upstream, UpstreamView


@dataclass(frozen=True, slots=True)
class InFlightView:
    id: str
    owner: str
    upstream: str
    upstream_id: str | None  # the upstream's own id for it, where it says (Ferry)
    ttft: float | None
    output_tokens: int
    max_tokens: int
    elapsed: float


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model of the front's /v1/models: the upstreams that serve it."""

    id: str
    upstreams: tuple[str, ...]  # their names (host:port)
    max_context: int | None  # the least its upstreams say, where they say


def served_models(upstreams: list[Upstream]) -> tuple[ServedModel, ...]:
    out = []
    for model, ups in served(upstreams).items():
        # an upstream's context length is its first model's (what /v1/models says of it)
        contexts = [u.max_context for u in ups if u.max_context and u.model == model]
        out.append(ServedModel(model, tuple(u.name for u in ups),
                               min(contexts) if contexts else None))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class GatewayView:
    upstreams: tuple[UpstreamView, ...]
    in_flight: tuple[InFlightView, ...]
    waiting: int
    summary: str  # one line: "2 upstreams up · 3 in flight · 1 waiting"


def request_view(req: GatewayRequest, now: float, position: int | None,
                 reason: WaitReason | None, slot: int | None) -> RequestView:
    ttft = req.first_token_at - req.arrival if req.first_token_at is not None else None
    itl = req.itl_sum / (req.output_tokens - 1) if req.output_tokens > 1 else None
    state = "finished" if req.state == "finished" else req.state
    waited = (req.admitted_at if req.admitted_at is not None else now) - req.arrival
    return RequestView(
        id=req.id, owner=req.owner, state=state, position=position, reason=reason, slot=slot,
        prompt_tokens=req.prompt_tokens, cached_tokens=req.cached_tokens,
        prefill_done=req.prompt_tokens if req.state != "waiting" else 0, chunk=0, num_chunks=1,
        output_tokens=req.output_tokens, max_tokens=req.params.max_tokens, arrival=req.arrival,
        waited=waited, ttft=ttft, itl=itl, finish_reason=req.finish_reason)


def build(upstreams: list[Upstream], order: list[GatewayRequest],
          reasons: dict[str, WaitReason], running: list[GatewayRequest],
          finished: tuple[RequestView, ...], metrics: MetricsView, admission: str
          ) -> tuple[EngineSnapshot, GatewayView]:
    now = time.monotonic()
    slots: list[str | None] = []
    slot_of: dict[str, int] = {}
    by_upstream: dict[str, list[GatewayRequest]] = {}
    for req in running:
        if req.upstream is not None:
            by_upstream.setdefault(req.upstream.name, []).append(req)
    for up in upstreams:
        mine = by_upstream.get(up.name, [])
        for req in mine:
            slot_of[req.id] = len(slots)
            slots.append(req.id)
        slots.extend([None] * max(0, up.cap() - len(mine)))
    waiting = tuple(request_view(r, now, i + 1, reasons.get(r.id), None)
                    for i, r in enumerate(order))
    run_views = tuple(request_view(r, now, None, None, slot_of.get(r.id))
                      for r in sorted(running, key=lambda r: r.arrival))
    snap = EngineSnapshot(
        time=now, busy=bool(order or running), policy="gateway", admission=admission,
        max_running=sum(u.cap() for u in upstreams), max_prefill_tokens=0,
        page_size=1, waiting=waiting, running=run_views, slots=tuple(slots),
        kv=KVView(0, 0, 0, 0, 0), rounds=(), metrics=metrics, recent_finished=finished)
    flights = tuple(
        InFlightView(r.id, r.owner, r.upstream.name if r.upstream else "?", r.upstream_id,
                     r.first_token_at - r.arrival if r.first_token_at is not None else None,
                     r.output_tokens, r.params.max_tokens,
                     now - (r.admitted_at or r.arrival))
        for r in sorted(running, key=lambda r: r.arrival))
    up_views = tuple(u.view() for u in upstreams)
    healthy = sum(1 for u in up_views if u.health in ("up", "slow"))
    summary = (f"{healthy} of {len(up_views)} upstream{'s' if len(up_views) > 1 else ''} up"
               f" · {len(flights)} in flight · {len(order)} waiting")
    return snap, GatewayView(up_views, flights, len(order), summary)


class GatewayCollector(Collector):
    """`ferry:gateway_*` for /metrics, read from the view at scrape time: Ferry's own queue,
    its requests on each upstream against the cap, and each upstream's health."""

    def __init__(self, view: Callable[[], GatewayView]) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        v = self.view()
        waiting = GaugeMetricFamily("ferry:gateway_requests_waiting",
                                    "Requests waiting in Ferry's queue for an upstream.")
        waiting.add_metric([], v.waiting)
        yield waiting
        in_flight = GaugeMetricFamily("ferry:gateway_requests_in_flight",
                                      "Ferry's requests on the upstream now.", labels=["upstream"])
        cap = GaugeMetricFamily("ferry:gateway_max_in_flight", "The upstream's in-flight cap.",
                                labels=["upstream"])
        up = GaugeMetricFamily("ferry:gateway_upstream_up",
                               "1 while the upstream answers (up or slow), else 0.",
                               labels=["upstream"])
        health = GaugeMetricFamily("ferry:gateway_upstream_health",
                                   "1 for the upstream's health now.",
                                   labels=["upstream", "health"])
        sent = CounterMetricFamily("ferry:gateway_requests_sent",
                                   "Requests Ferry sent the upstream.", labels=["upstream"])
        for u in v.upstreams:
            in_flight.add_metric([u.name], u.in_flight)
            cap.add_metric([u.name], u.max_in_flight)
            up.add_metric([u.name], 1.0 if u.health in ("up", "slow") else 0.0)
            for state in ("unknown", "up", "slow", "down"):
                health.add_metric([u.name, state], 1.0 if u.health == state else 0.0)
            sent.add_metric([u.name], u.served)
        yield from (in_flight, cap, up, health, sent)

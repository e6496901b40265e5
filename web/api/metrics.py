"""GET /metrics (Prometheus, names like vLLM's under `ferry:`) and GET /healthz."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from litestar import Controller, Request, Response, get
from msgspec import Struct
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine import MetricsView
from web.serving import Serving


class EngineCollector(Collector):
    """Reads the latest snapshot at scrape time; nothing is recorded twice."""

    def __init__(self, engine: Serving, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        snap = self.engine.snapshot()
        m, kv = snap.metrics, snap.kv
        labels = ["model_name"]
        model = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"ferry:{name}", doc, labels=labels)
            g.add_metric(model, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"ferry:{name}", doc, labels=labels)
            c.add_metric(model, value)
            return c

        waiting = sum(1 for v in snap.waiting if v.state == "waiting")
        yield gauge("num_requests_running", "Admitted requests (mid-prefill included).",
                    len(snap.running))
        yield gauge("num_requests_waiting", "Requests in the waiting queue, not admitted.",
                    waiting)
        yield gauge("num_free_slots", "Free rows in the request table.", snap.free_slots)
        yield gauge("kv_cache_usage_perc", "Fraction of KV positions held by live requests "
                    "(1 = full).", kv.usage)
        positions = GaugeMetricFamily("ferry:kv_cache_positions",
                                      "KV pool positions by use.", labels=[*labels, "kind"])
        for kind in ("used", "reserved", "cached", "free"):
            positions.add_metric([*model, kind], getattr(kv, kind))
        yield positions
        if snap.local_kv is not None:  # the local (sliding-window) layers' own pool
            local = snap.local_kv
            yield gauge("kv_cache_local_usage_perc", "Fraction of the local (sliding-window) "
                        "layers' KV positions held by live requests (1 = full).", local.usage)
            local_positions = GaugeMetricFamily(
                "ferry:kv_cache_local_positions", "Local (sliding-window) layers' KV pool "
                f"positions by use (they keep a window of {snap.sliding_window}).",
                labels=[*labels, "kind"])
            for kind in ("used", "reserved", "free"):
                local_positions.add_metric([*model, kind], getattr(local, kind))
            yield local_positions
        yield gauge("generation_tokens_per_second", "Output tokens per second, recent window.",
                    m.output_tokens_per_s)
        yield counter("generation_tokens", "Output tokens generated.", m.output_tokens_total)
        yield counter("prompt_tokens", "Prompt tokens computed (prefix-cache hits excluded).",
                      m.prefill_tokens_total)
        finished = CounterMetricFamily("ferry:request_success", "Finished requests by reason.",
                                       labels=[*labels, "finished_reason"])
        for reason, value in (("completed", m.completed), ("cancelled", m.cancelled),
                              ("error", m.errors)):
            finished.add_metric([*model, reason], value)
        yield finished
        yield counter("requests_rejected", "Requests refused because a queue bound was hit.",
                      m.rejected)
        kinds = CounterMetricFamily("ferry:structured_requests", "Finished requests whose "
                                    "output was grammar-constrained, by kind.",
                                    labels=[*labels, "kind"])
        for kind, value in m.structured_requests:
            kinds.add_metric([*model, kind], value)
        yield kinds
        # speculative decoding (vLLM reports spec_decode_num_draft/accepted_tokens alike)
        drafter = GaugeMetricFamily("ferry:spec_decode_drafter", "What drafts for "
                                    "speculative decoding (1 on the engine's kind: ngram is "
                                    "prompt lookup, draft a draft model, off none).",
                                    labels=[*labels, "drafter"])
        drafter.add_metric([*model, snap.speculative], 1)
        yield drafter
        yield counter("spec_decode_num_draft_tokens", "Tokens drafted for speculative "
                      "decoding (by the drafter ferry:spec_decode_drafter names).",
                      m.drafted_tokens)
        yield counter("spec_decode_num_accepted_tokens", "Drafted tokens the model kept.",
                      m.accepted_tokens)
        yield gauge("spec_decode_acceptance_rate", "Kept share of drafted tokens since "
                    "start (0 when nothing was drafted).", m.acceptance)
        yield counter("decode_steps", "Decoding request-rounds (one per running request "
                      "and round).", m.decode_steps)
        yield gauge("decode_tokens_per_step", "Output tokens per decoding request-round "
                    "since start (1 without speculation).", m.tokens_per_step)
        yield from self.histograms(m)

    def histograms(self, m: MetricsView) -> Iterator[Metric]:
        for name, doc, buckets, total in (
                ("time_to_first_token_seconds", "Time to first token (queueing included).",
                 m.ttft_buckets, m.ttft_sum),
                ("inter_token_latency_seconds", "Gap between consecutive output tokens.",
                 m.itl_buckets, m.itl_sum),
                ("structured_mask_seconds", "Time to compute one constrained token's mask "
                 "(on a worker, while the forward runs).", m.mask_buckets, m.mask_sum)):
            h = HistogramMetricFamily(f"ferry:{name}", doc, labels=["model_name"])
            pairs = [("+Inf" if b == float("inf") else repr(float(b)), n) for b, n in buckets]
            if pairs:
                h.add_metric([self.model_name], pairs, total)
            yield h


def make_registry(engine: Serving, model_name: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    extra = getattr(engine, "metrics_collector", None)  # upstream mode: the gateway's gauges
    if extra is not None:
        registry.register(extra())
    return registry


class Health(Struct):
    status: str
    engine: bool


class SystemController(Controller):
    tags = ("System",)

    @get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE_LATEST)
    async def metrics(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        registry: CollectorRegistry = request.app.state.metrics
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @get("/healthz", summary="Liveness: the server answers; `engine` tells if its thread runs")
    async def healthz(self, request: Request[Any, Any, Any]) -> Health:
        return Health("ok", request.app.state.services.engine.alive)

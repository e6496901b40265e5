"""One upstream as the gateway sees it: health (up, slow, down, since when), kind, model,
Ferry's requests in flight to it, and its own figures from the last scrape."""
from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from web.gateway import probe
from web.gateway.client import auth_headers
from web.gateway.config import GatewayConfig, UpstreamConfig

HEALTHS = ("unknown", "up", "slow", "down")
MODELS_EVERY = 10  # looks between reads of a healthy upstream's model list
# the cap of an upstream that says neither its slots nor a waiting queue yet; it stops
# growing as soon as the upstream reports requests waiting
OPEN_CAP = 64


@dataclass(frozen=True, slots=True)
class UpstreamView:
    """What the dashboard shows of an upstream (never its API key)."""

    name: str
    kind: str
    health: str
    since: float  # wall-clock time the health last changed
    error: str | None
    model: str | None
    models: tuple[str, ...]  # every model it lists (model is the first)
    in_flight: int  # Ferry's requests on it now
    max_in_flight: int
    served: int  # requests Ferry sent it in all
    running: float | None  # the upstream's own figures, last scrape
    waiting: float | None
    kv_usage: float | None
    tokens_per_s: float | None
    ttft: float | None  # mean over the last scrape interval
    itl: float | None
    slots: tuple[int, int] | None
    upstream_requests: int | None  # Ferry upstreams: its /v1/requests count

    @property
    def since_clock(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.since))


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.name = config.name
        self.kind = config.kind or "openai"
        self.kind_known = config.kind is not None
        self.health = "unknown"
        self.since = time.time()
        self.error: str | None = None
        self.model: str | None = None
        self.models: tuple[str, ...] = ()  # what its /v1/models lists: what it is sent
        self.max_context: int | None = None
        self.in_flight: set[str] = set()
        self.served = 0
        self.figures = probe.Figures()
        self.tokens_per_s: float | None = None
        self.ttft: float | None = None
        self.itl: float | None = None
        self.upstream_requests: int | None = None
        self._last: tuple[float, probe.Figures] | None = None
        self._looks = 0

    # -- health --------------------------------------------------------------------------
    def mark(self, health: str, error: str | None = None) -> bool:
        """Set health; True when it changed."""
        self.error = error if health in ("down", "slow") else None
        if health == self.health:
            return False
        self.health, self.since = health, time.time()
        return True

    @property
    def usable(self) -> bool:
        return self.health != "down"

    def cap(self) -> int:
        """Requests Ferry lets it hold at once: the configured max_in_flight, else what it
        can run, so the overflow waits in Ferry's queue (its order, fair share and reasons)
        rather than in the upstream's: its slots where it says (Ferry's /metrics, llama.cpp's
        /slots); else, while it reports requests waiting, no more than Ferry has there now."""
        if self.config.max_in_flight is not None:
            return self.config.max_in_flight
        f = self.figures
        if f.slots_total:
            return f.slots_total
        if f.waiting:
            return max(1, len(self.in_flight))
        return OPEN_CAP

    @property
    def full(self) -> bool:
        return len(self.in_flight) >= self.cap()

    def load(self) -> float:
        """Fraction of capacity in use, from the upstream's own figures where it reports them
        (they count other clients too) and Ferry's in-flight count (fresher)."""
        own = (self.figures.running or 0) + (self.figures.waiting or 0)
        return max(len(self.in_flight), own) / self.cap()

    # -- scraping ------------------------------------------------------------------------
    async def scrape(self, client: httpx.AsyncClient, config: GatewayConfig) -> bool:
        """One look at the upstream; True when its health changed. Its model list is read
        on the first look, after trouble, and every MODELS_EVERY looks: each request is
        work for the upstream too."""
        headers = auth_headers(self.config.api_key)
        base = self.config.url
        started = time.monotonic()
        self._looks += 1
        try:
            status = await self._scrape_metrics(client, base, headers)
            if self.model is None or self.health in ("unknown", "down") or \
                    status not in (200, 404) or self._looks % MODELS_EVERY == 0:
                r = await client.get(base + "/v1/models", headers=headers)
                if r.status_code in (401, 403):
                    return self.mark("down", f"refused Ferry's API key ({r.status_code})")
                if r.status_code != 200:
                    return self.mark("down", f"/v1/models answered {r.status_code}")
                info = probe.model_info(r.json())
                self.model = info.name or self.model
                self.models = info.ids or self.models
                self.max_context = info.max_context or self.max_context
        except httpx.HTTPError as exc:
            return self.mark("down", f"cannot be reached ({type(exc).__name__})")
        except ValueError as exc:
            return self.mark("down", f"sent garbage: {exc}")
        took = time.monotonic() - started
        if took > config.slow_after:
            return self.mark("slow", f"answered its metrics in {took:.1f} s")
        return self.mark("up")

    async def _scrape_metrics(self, client: httpx.AsyncClient, base: str,
                              headers: dict[str, str]) -> int:
        """Read its figures; the /metrics status (404: it has none)."""
        samples: dict[str, float] = {}
        r = await client.get(base + "/metrics", headers=headers)
        if r.status_code == 200:
            try:
                samples = probe.parse_metrics(r.text)
            except ValueError:
                samples = {}  # not Prometheus text: treat as no metrics
        if not self.kind_known:
            detected = probe.detect_kind(samples) or \
                await probe.guess_kind_without_metrics(client, base, headers)
            self.kind, self.kind_known = detected, True
        figures = probe.figures(self.kind, samples)
        if self.kind == "llamacpp":
            s = await probe.slots(client, base, headers)
            if s is not None:
                figures = _with_slots(figures, s)
        if self.kind == "ferry":
            r2 = await client.get(base + "/v1/requests", headers=headers)
            data = r2.json() if r2.status_code == 200 else None
            self.upstream_requests = len(data["data"]) if isinstance(data, dict) and \
                isinstance(data.get("data"), list) else None
        self._rates(figures)
        self.figures = figures
        return r.status_code

    def _rates(self, now_figures: probe.Figures) -> None:
        """Throughput and mean TTFT/ITL over the interval since the last scrape."""
        now = time.monotonic()
        if self._last is not None:
            then, old = self._last
            dt = now - then
            if now_figures.generated_total is not None and old.generated_total is not None \
                    and dt > 0:
                self.tokens_per_s = max(0.0, now_figures.generated_total
                                        - old.generated_total) / dt
            self.ttft = _mean(now_figures.ttft_sum, now_figures.ttft_count, old.ttft_sum,
                              old.ttft_count, self.ttft)
            self.itl = _mean(now_figures.itl_sum, now_figures.itl_count, old.itl_sum,
                             old.itl_count, self.itl)
        self._last = (now, now_figures)

    def view(self) -> UpstreamView:
        f = self.figures
        slots = (f.slots_busy, f.slots_total) if f.slots_total is not None and \
            f.slots_busy is not None else None
        return UpstreamView(
            self.name, self.kind, self.health, self.since, self.error, self.model, self.models,
            len(self.in_flight), self.cap(), self.served, f.running, f.waiting,
            f.kv_usage, self.tokens_per_s, self.ttft, self.itl, slots, self.upstream_requests)


def _with_slots(f: probe.Figures, slots: tuple[int, int]) -> probe.Figures:
    from dataclasses import replace
    return replace(f, slots_busy=slots[0], slots_total=slots[1])


def _mean(s: float | None, n: float | None, s0: float | None, n0: float | None,
          previous: float | None) -> float | None:
    if s is None or n is None or s0 is None or n0 is None or n <= n0:
        return previous  # nothing new in this interval: keep the last figure
    return (s - s0) / (n - n0)

"""The gateway's state and what happens on the event loop: the waiting queue, dispatch to
upstreams, their streams, failures and retries, cancel, finish, snapshots, scraping.

One owner of the state: the server's event loop. Every method here runs on it; the facade
(web/gateway/gateway.py) hops calls from other threads onto it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque

import httpx

from engine import EngineSnapshot, FinalEvent, RequestView, TextDelta, Timings, Usage
from web.gateway import queue as rules
from web.gateway import views
from web.gateway.client import Chunk, UpstreamError, abort, request_body, stream_chunks
from web.gateway.config import GatewayConfig
from web.gateway.queue import GatewayRequest
from web.gateway.stats import GatewayStats
from web.gateway.upstream import Upstream

log = logging.getLogger("web.gateway")
TICK = 0.25  # seconds between the gateway's own looks while requests wait (deadlines)
FINISH = {"stop": "stop", "length": "length", "abort": "cancelled", "cancelled": "cancelled"}


class GatewayCore:
    def __init__(self, config: GatewayConfig, model_name: str = "default") -> None:
        self.gateway_config = config
        self.model_name = model_name
        self.admission = config.admission
        self.upstreams = [Upstream(u) for u in config.upstreams]
        self.waiting: list[GatewayRequest] = []  # by arrival
        self.live: dict[str, GatewayRequest] = {}
        self.last_served: dict[str, int] = {}  # owner -> dispatch tick of its last request
        self._tick = 0
        self._stats = GatewayStats()
        self._finished: deque[RequestView] = deque(maxlen=64)
        self._per_owner: dict[str, int] = {}
        self._lock = threading.Lock()  # guards live/_per_owner for calls off the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._queued = asyncio.Event()  # set when a request joins the queue: wakes the ticker
        self._dirty = True
        self._snapshot: EngineSnapshot | None = None
        self._view: views.GatewayView | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.last_error: str | None = None
        self.dispatch_log: deque[tuple[str, str, str]] = deque(maxlen=256)  # (id, owner, up)

    def down_message(self, upstreams: list[Upstream] | None = None, model: str = "") -> str:
        """Why nothing can take a request: every upstream (or every one serving `model`)
        is down, or none serves the model now."""
        ups = self.upstreams if upstreams is None else upstreams
        if not ups:
            return f"no upstream serves the model {model!r} now. Try again in a few seconds."
        parts = [f"{u.name} down since {time.strftime('%H:%M:%S', time.localtime(u.since))}"
                 + (f" ({u.error})" if u.error else "") for u in ups]
        n = len(ups)
        head = "the upstream is down" if n == 1 else f"all {n} upstreams are down"
        if upstreams is not None and len(rules.served(self.upstreams)) > 1:
            head += f" for {model}"
        return f"{head}: {'; '.join(parts)}. Try again in a few seconds."

    def routes(self, model: str) -> list[Upstream]:
        """The upstreams that serve `model`."""
        return rules.routes(self.upstreams, model, self.model_name)

    # -- on the loop ---------------------------------------------------------------------------
    def _changed(self) -> None:
        self._dirty = True

    def _enqueue(self, req: GatewayRequest) -> None:
        if req.state != "waiting" or req.id not in self.live:
            return  # cancelled before it reached the loop
        self.waiting.append(req)
        self._queued.set()
        self._pump()

    def _plan(self) -> rules.Plan:
        in_flight: dict[str, int] = {}
        for r in self.live.values():
            if r.state == "running":
                in_flight[r.owner] = in_flight.get(r.owner, 0) + 1
        return rules.plan(self.waiting, self.admission, self.last_served, in_flight,
                          self.gateway_config.user_in_flight)

    def _pump(self) -> None:
        """Send waiting requests to upstreams while any has room."""
        while self.waiting and (found := self._next()) is not None:
            self._dispatch(*found)
        self._changed()

    def _next(self) -> tuple[GatewayRequest, Upstream] | None:
        """The first request in the plan's order that an upstream serving its model can take
        now. Head of line per model: a model whose upstreams are all busy holds back its own
        later requests (their order stays), never another model's."""
        blocked: set[str] = set()
        for req in self._plan().order:
            if req.model in blocked:
                continue
            up = rules.choose_upstream(self.routes(req.model), req.tried)
            if up is not None:
                return req, up
            blocked.add(req.model)
        return None

    def _dispatch(self, req: GatewayRequest, up: Upstream) -> None:
        assert self._loop is not None
        self.waiting.remove(req)
        self._tick += 1
        self.last_served[req.owner] = self._tick
        req.state, req.upstream, req.down_since = "running", up, None
        req.admitted_at = req.admitted_at or time.monotonic()
        up.in_flight.add(req.id)
        up.served += 1
        req.attempts += 1
        self.dispatch_log.append((req.id, req.owner, up.name))
        req.task = self._loop.create_task(self._run(req, up))

    async def _run(self, req: GatewayRequest, up: Upstream) -> None:
        assert self._client is not None
        # the model asked for; the upstream's own where the default went to one that does not
        # list it (lists not read yet)
        model = req.model if req.model in up.models or not up.model else up.model
        path, body = request_body(req.prompt, req.params, model, up.kind, req.id)

        def opened(response: httpx.Response) -> None:
            req.upstream_id = response.headers.get("x-request-id")

        try:
            async for chunk in stream_chunks(self._client, up.config.url, up.name,
                                             up.config.api_key, path, body, opened):
                if req.state != "running" or req.upstream is not up:
                    return
                self._on_chunk(req, chunk)
        except UpstreamError as exc:
            if req.state == "running" and req.upstream is up:
                self._on_failure(req, up, exc)
            return
        except asyncio.CancelledError:
            return  # cancel() already ended it; leaving the stream closes the connection
        except Exception as exc:  # a bug here must not leave the request hanging
            log.exception("gateway request %s failed", req.id)
            if req.state == "running":
                self._finish(req, "error", f"the gateway failed: {exc}")
            return
        if req.state == "running" and req.upstream is up:
            self._finish(req, FINISH.get(req.finish_reason or "stop", "stop"), None)
            self._pump()  # its place upstream is free: the next in line goes

    def _on_chunk(self, req: GatewayRequest, chunk: Chunk) -> None:
        now = time.monotonic()
        if chunk.text or chunk.reasoning:
            ttft = itl = None
            if req.first_token_at is None:
                req.first_token_at = now
                ttft = now - req.arrival
            elif req.last_token_at is not None:
                itl = now - req.last_token_at
                req.itl_sum += itl
            req.last_token_at = now
            req.output_tokens += 1
            self._stats.on_token(now, ttft, itl)
            req.handle.put(TextDelta(chunk.text, (), reasoning=chunk.reasoning))
        if chunk.finish_reason:
            req.finish_reason = chunk.finish_reason
        if chunk.completion_tokens is not None:
            req.output_tokens = chunk.completion_tokens
            req.prompt_tokens = chunk.prompt_tokens or req.prompt_tokens
            req.cached_tokens = chunk.cached_tokens
        self._changed()

    def _on_failure(self, req: GatewayRequest, up: Upstream, exc: UpstreamError) -> None:
        up.in_flight.discard(req.id)
        if exc.down:
            up.mark("down", str(exc))
        self.last_error = str(exc)
        log.warning("upstream %s: %s (request %s)", up.name, exc, req.id)
        if req.output_tokens == 0 and exc.retry and req.attempts <= \
                self.gateway_config.retries:
            req.tried.add(up.name)
            req.state, req.upstream, req.upstream_id = "waiting", None, None
            self.waiting.insert(0, req)  # first in line again: it has waited already
            self._queued.set()
            self._pump()
            return
        if req.output_tokens:
            message = f"{exc}; the reply is incomplete ({req.output_tokens} tokens arrived)"
        else:
            message = str(exc)
        self._finish(req, "error", message)
        self._pump()

    def _cancel_now(self, request_id: str, reason: str, error: str | None) -> None:
        req = self.live.get(request_id)
        if req is None or req.state == "finished":
            return
        up, task = req.upstream, req.task
        if req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, "stop" if reason == "stop" else "cancelled", error)
        if task is not None and not task.done():
            task.cancel()  # closes the upstream stream (vLLM, SGLang, llama.cpp abort on it)
        if up is not None and self._client is not None and self._loop is not None:
            self._loop.create_task(abort(self._client, up.config.url, up.kind,
                                         up.config.api_key, req.id, req.upstream_id))
        self._pump()

    def _finish(self, req: GatewayRequest, reason: str, error: str | None) -> None:
        now = time.monotonic()
        req.state, req.finish_reason = "finished", reason
        if req.upstream is not None:
            req.upstream.in_flight.discard(req.id)
        with self._lock:
            self.live.pop(req.id, None)
            self._per_owner[req.owner] -= 1
            if not self._per_owner[req.owner]:
                del self._per_owner[req.owner]
            if not self.live:
                self._idle.set()
        self._stats.on_finish(reason, req.prompt_tokens)
        self._finished.append(views.request_view(req, now, None, None, None))
        tpot = (req.last_token_at - req.first_token_at) / (req.output_tokens - 1) if \
            req.output_tokens > 1 and req.first_token_at is not None and \
            req.last_token_at is not None else None
        timings = Timings(
            queued=(req.admitted_at or now) - req.arrival,
            ttft=None if req.first_token_at is None else req.first_token_at - req.arrival,
            tpot=tpot, total=now - req.arrival)
        usage = Usage(req.prompt_tokens, req.output_tokens, req.cached_tokens)
        extra: dict[str, object] = {"upstream": req.upstream.name} if req.upstream else {}
        req.handle.put(FinalEvent(reason, usage, timings, error, extra))  # type: ignore[arg-type]
        self._changed()

    def _publish(self) -> None:
        plan = self._plan()
        reasons = rules.reasons(plan, self.routes, len(rules.served(self.upstreams)) > 1,
                                self.gateway_config.user_in_flight)
        running = [r for r in self.live.values() if r.state == "running"]
        self._snapshot, self._view = views.build(
            self.upstreams, plan.order + plan.user_limited, reasons, running,
            tuple(self._finished), self._stats.view(time.monotonic()), self.admission)
        self._dirty = False

    async def _scrape_loop(self, up: Upstream) -> None:
        assert self._client is not None
        interval = self.gateway_config.scrape_interval
        while True:
            try:
                changed = await up.scrape(self._client, self.gateway_config)
            except Exception:  # a scrape must never end the loop
                log.exception("scraping %s failed", up.name)
                changed = up.mark("down", "the scrape failed")
            if changed:
                log.info("upstream %s is %s%s", up.name, up.health,
                         f" ({up.error})" if up.error else "")
            self._pump()  # a recovered upstream, or new load figures, may take work
            await asyncio.sleep(interval)

    async def _ticker(self) -> None:
        """Fail requests that waited `down_wait` seconds with every upstream that serves
        their model down (or none serving it)."""
        while True:
            if not self.waiting:  # nothing to look at: sleep until a request waits
                self._queued.clear()
                await self._queued.wait()
            await asyncio.sleep(TICK)
            now = time.monotonic()
            for req in list(self.waiting):
                ups = self.routes(req.model)
                if any(u.usable for u in ups):
                    req.down_since = None
                    continue
                req.down_since = req.down_since or now
                if now - req.down_since >= self.gateway_config.down_wait:
                    self.waiting.remove(req)
                    self._finish(req, "error", self.down_message(ups, req.model))
            if self.waiting:
                self._changed()  # waited times and reasons move on

"""The gateway: Engine's facade in front of upstream servers (design.md §10).

One owner of the state: the server's event loop. submit, cancel and every upstream stream
run on it, so the waiting queue, the in-flight sets and the upstreams' health change in one
place; calls from other threads hop onto the loop. Requests wait in Ferry's queue (fair
round-robin across users), go to the least-loaded upstream below its in-flight cap, and are
retried on another upstream if one refuses before producing anything.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

import httpx

from engine import (
    EngineSnapshot,
    FinalEvent,
    QueueFull,
    RequestError,
    RequestView,
    SamplingParams,
    TextDelta,
    Timings,
    Usage,
)
from web.gateway import queue as rules
from web.gateway import views
from web.gateway.client import Chunk, UpstreamError, abort, request_body, stream_chunks
from web.gateway.config import GatewayConfig
from web.gateway.handle import GatewayHandle
from web.gateway.queue import GatewayRequest
from web.gateway.stats import GatewayStats
from web.gateway.upstream import Upstream
from web.services import EngineUnavailable

log = logging.getLogger(__name__)
TICK = 0.25  # seconds between the gateway's own looks (down-wait deadlines)
FINISH = {"stop": "stop", "length": "length", "abort": "cancelled", "cancelled": "cancelled"}


class UpstreamsDown(EngineUnavailable):
    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """The EngineConfig fields the web layer reads, for the gateway."""

    max_context: int
    max_waiting: int
    max_running: int
    kv_tokens: int
    page_size: int = 1
    prefix_cache: bool = False
    policy: str = "gateway"
    admission: str = "fair"
    max_prefill_tokens: int = 0


class Gateway:
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
        self._dirty = True
        self._snapshot: EngineSnapshot | None = None
        self._view: views.GatewayView | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.last_error: str | None = None
        self.dispatch_log: deque[tuple[str, str, str]] = deque(maxlen=256)  # (id, owner, up)

    # -- lifecycle (start on the loop; stop from any thread) ---------------------------------
    def start(self) -> Gateway:
        self._loop = asyncio.get_running_loop()
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per scrape otherwise
        self._loop_thread = threading.get_ident()
        cfg = self.gateway_config
        timeout = httpx.Timeout(connect=cfg.connect_timeout, read=cfg.stall_timeout, write=10,
                                pool=None)
        self._client = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=64))
        for up in self.upstreams:
            self._tasks.append(self._loop.create_task(self._scrape_loop(up)))
        self._tasks.append(self._loop.create_task(self._ticker()))
        return self

    @property
    def alive(self) -> bool:
        return self._loop is not None and not self._loop.is_closed() and bool(self._tasks)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is live (partial output is kept), stop scraping, close the client."""
        if self._loop is None or not self._tasks:
            return
        if threading.get_ident() == self._loop_thread:
            self._loop.create_task(self._shutdown())
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)

    async def _shutdown(self) -> None:
        tasks, self._tasks = self._tasks, []
        for req in list(self.live.values()):
            self._cancel_now(req.id, "cancelled", "the server is shutting down")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    # -- the engine facade -------------------------------------------------------------------
    @property
    def config(self) -> GatewayLimits:
        contexts = [u.max_context for u in self.upstreams if u.max_context]
        context = min(contexts) if contexts else self.gateway_config.default_context
        cap = sum(u.config.max_in_flight for u in self.upstreams)
        return GatewayLimits(context, self.gateway_config.max_waiting, cap, context,
                             admission=self.admission)

    def submit(self, prompt_ids: list[int], params: SamplingParams, owner: str = "local",
               request_id: str | None = None, owner_limit: int | None = None) -> GatewayHandle:
        """Queue a request. Raises RequestError, QueueFull (429) or UpstreamsDown (503)."""
        if not self.alive:
            raise EngineUnavailable("the gateway is not running")
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        if params.logprobs is not None or params.prompt_logprobs is not None:
            raise RequestError("logprobs are not available in upstream mode")
        if params.max_tokens < 1:
            raise RequestError("max_tokens must be >= 1 in upstream mode")
        down = [u for u in self.upstreams if u.health == "down"]
        if len(down) == len(self.upstreams):
            raise UpstreamsDown(self.down_message(), self.gateway_config.retry_after)
        rid = request_id or uuid.uuid4().hex[:12]
        handle = GatewayHandle(rid, owner, len(prompt_ids), self.cancel)
        req = GatewayRequest(rid, owner, prompt_ids, params, handle,
                             prompt_tokens=len(prompt_ids))
        with self._lock:
            queued = sum(1 for r in self.live.values() if r.state == "waiting")
            if queued >= self.gateway_config.max_waiting:
                self._stats.rejected += 1
                raise QueueFull(f"the queue is full ({queued} waiting for the upstreams)")
            if owner_limit is not None and self._per_owner.get(owner, 0) >= owner_limit:
                self._stats.rejected += 1
                raise QueueFull(f"{owner} already has {owner_limit} requests queued or running")
            if rid in self.live:
                raise RequestError(f"request id {rid} is in use")
            self.live[rid] = req
            self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
            self._idle.clear()
        self._on_loop(lambda: self._enqueue(req))
        return handle

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        with self._lock:
            req = self.live.get(request_id)
        if req is None or req.state == "finished":
            return False
        self._on_loop(lambda: self._cancel_now(request_id, reason, None))
        return True

    def handle(self, request_id: str) -> GatewayHandle | None:
        with self._lock:
            req = self.live.get(request_id)
        return req.handle if req is not None else None

    def live_ids(self, owner: str | None = None) -> list[str]:
        with self._lock:
            return [r.id for r in self.live.values() if owner is None or r.owner == owner]

    def wait_idle(self, timeout: float = 30.0) -> bool:
        return self._idle.wait(timeout)

    def reconfigure(self, policy: str | None = None, admission: str | None = None) -> None:
        if policy is not None and policy != "gateway":
            raise ValueError("upstream mode has no engine policy: the upstreams schedule "
                             "their own batches")
        if admission is not None:
            if admission not in ("fair", "fifo"):
                raise ValueError(f"unknown admission order {admission!r}")
            self._on_loop(lambda: self._set_admission(admission))

    def snapshot(self) -> EngineSnapshot:
        if self._snapshot is None or (self._dirty and threading.get_ident() ==
                                      self._loop_thread):
            self._publish()
        assert self._snapshot is not None
        return self._snapshot

    def gateway_view(self) -> views.GatewayView:
        self.snapshot()
        assert self._view is not None
        return self._view

    def down_message(self) -> str:
        parts = [f"{u.name} down since {time.strftime('%H:%M:%S', time.localtime(u.since))}"
                 + (f" ({u.error})" if u.error else "") for u in self.upstreams]
        n = len(self.upstreams)
        head = "the upstream is down" if n == 1 else f"all {n} upstreams are down"
        return f"{head}: {'; '.join(parts)}. Try again in a few seconds."

    # -- on the loop -------------------------------------------------------------------------
    def _on_loop(self, fn: object) -> None:
        assert self._loop is not None and callable(fn)
        if threading.get_ident() == self._loop_thread:
            fn()
        else:
            self._loop.call_soon_threadsafe(fn)

    def _set_admission(self, admission: str) -> None:
        self.admission = admission
        self._changed()

    def _changed(self) -> None:
        self._dirty = True

    def _enqueue(self, req: GatewayRequest) -> None:
        if req.state != "waiting" or req.id not in self.live:
            return  # cancelled before it reached the loop
        self.waiting.append(req)
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
        while self.waiting:
            order = self._plan().order
            if not order:
                break
            req = order[0]
            up = rules.choose_upstream(self.upstreams, req.tried)
            if up is None:
                break
            self._dispatch(req, up)
        self._changed()

    def _dispatch(self, req: GatewayRequest, up: Upstream) -> None:
        assert self._loop is not None
        self.waiting.remove(req)
        self._tick += 1
        self.last_served[req.owner] = self._tick
        req.state, req.upstream, req.down_since = "running", up, None
        req.admitted_at = req.admitted_at or time.monotonic()
        up.in_flight.add(req.id)
        up.served += 1
        self.dispatch_log.append((req.id, req.owner, up.name))
        req.task = self._loop.create_task(self._run(req, up))

    async def _run(self, req: GatewayRequest, up: Upstream) -> None:
        assert self._client is not None
        path, body = request_body(req.prompt, req.params, up.model or self.model_name, up.kind,
                                  req.id)

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

    def _on_chunk(self, req: GatewayRequest, chunk: Chunk) -> None:
        now = time.monotonic()
        if chunk.text:
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
            req.handle.put(TextDelta(chunk.text, ()))
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
        if req.output_tokens == 0 and exc.retry and len(req.tried) < \
                self.gateway_config.retries:
            req.tried.add(up.name)
            req.state, req.upstream, req.upstream_id = "waiting", None, None
            self.waiting.insert(0, req)  # first in line again: it has waited already
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
        reasons = rules.reasons(plan, self.upstreams, self.gateway_config.user_in_flight)
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
            self._changed()
            if changed:
                log.info("upstream %s is %s%s", up.name, up.health,
                         f" ({up.error})" if up.error else "")
                self._pump()
            await asyncio.sleep(interval)

    async def _ticker(self) -> None:
        """Fail requests that waited `down_wait` seconds with every upstream down."""
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            all_down = all(not u.usable for u in self.upstreams)
            for req in list(self.waiting):
                if not all_down:
                    req.down_since = None
                    continue
                req.down_since = req.down_since or now
                if now - req.down_since >= self.gateway_config.down_wait:
                    self.waiting.remove(req)
                    self._finish(req, "error", self.down_message())
            if self.waiting:
                self._changed()  # waited times and reasons move on

"""The gateway: Engine's facade in front of upstream servers (docs/upstreams.md).

One owner of the state: the server's event loop. submit, cancel and every upstream stream
run on it (web/gateway/core.py), so the waiting queue, the in-flight sets and the upstreams'
health change in one place; calls from other threads hop onto the loop. Requests wait in
Ferry's queue (fair round-robin across users), go to the least-loaded upstream below its
in-flight cap, and are retried on another upstream if one refuses before producing anything.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from engine import EngineSnapshot, QueueFull, RequestError, SamplingParams
from web.gateway import views
from web.gateway.core import GatewayCore
from web.gateway.handle import GatewayHandle
from web.gateway.queue import GatewayRequest
from web.services import EngineUnavailable


class UpstreamsDown(EngineUnavailable):
    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


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


class Gateway(GatewayCore):
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
        cap = sum(u.cap() for u in self.upstreams)
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
        # the model the client named travels with the fields passed upstream as they came
        asked = (getattr(prompt_ids, "extra", None) or {}).get("model")
        model = str(asked or self.model_name)
        ups = self.routes(model)
        if all(u.health == "down" for u in ups):
            raise UpstreamsDown(self.down_message(ups, model),
                                self.gateway_config.retry_after)
        rid = request_id or uuid.uuid4().hex[:12]
        handle = GatewayHandle(rid, owner, len(prompt_ids), self.cancel)
        req = GatewayRequest(rid, owner, prompt_ids, params, handle, model,
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

    def served_models(self) -> tuple[views.ServedModel, ...]:
        """The union of the upstreams' models (what the front's /v1/models lists), each with
        the upstreams that serve it; empty until an upstream's list is read."""
        return views.served_models(self.upstreams)

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
        """The state as of now; a new object only when something changed (the dashboard
        pushes on a new one). Built on the loop: other threads ask it and wait."""
        on_loop = threading.get_ident() == self._loop_thread
        if self._snapshot is None or (self._dirty and on_loop):
            self._publish()
        elif self._dirty and self._loop is not None and self._loop.is_running():
            done: concurrent.futures.Future[None] = concurrent.futures.Future()

            def publish() -> None:
                if self._dirty:
                    self._publish()
                done.set_result(None)
            self._loop.call_soon_threadsafe(publish)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                done.result(timeout=2.0)  # a stale view beats a stuck caller
        assert self._snapshot is not None
        return self._snapshot

    def gateway_view(self) -> views.GatewayView:
        self.snapshot()
        assert self._view is not None
        return self._view

    def metrics_collector(self) -> views.GatewayCollector:
        """The front's /metrics adds these to the engine-shaped ones (web/api/metrics.py)."""
        return views.GatewayCollector(self.gateway_view)

    # -- on the loop -------------------------------------------------------------------------
    def _on_loop(self, fn: Callable[[], None]) -> None:
        assert self._loop is not None
        if threading.get_ident() == self._loop_thread:
            fn()
        else:
            self._loop.call_soon_threadsafe(fn)

    def _set_admission(self, admission: str) -> None:
        self.admission = admission
        self._changed()

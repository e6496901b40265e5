"""Request inspection and cancel: GET /v1/requests, GET and DELETE /v1/requests/{id}.

Users see their own requests; an admin sees all. A request that finished recently is still
reported (from the web layer's tracker); one never seen, or another user's, is a 404.
"""
from __future__ import annotations

from typing import Any

import anyio
from litestar import Controller, Request, delete, get
from litestar.params import FromPath
from msgspec import Struct

from engine import RequestView
from web.access.identity import User, current_user
from web.api.errors import APIError, error_docs
from web.services import Services, services
from web.tracker import Tracked

CANCEL_WAIT = 5.0  # seconds DELETE waits for the engine to end the request (next round)


class Reason(Struct):
    code: str
    text: str


class RequestTimings(Struct):
    """Seconds: waited (arrival -> admission), ttft, itl (latest gap), tpot (mean gap), total
    (arrival -> end, once ended)."""

    waited: float | None = None
    ttft: float | None = None
    itl: float | None = None
    tpot: float | None = None
    total: float | None = None


class RequestInfo(Struct):
    id: str
    owner: str
    state: str  # waiting | chunked | running | finished
    phase: str
    position: int | None
    reason: Reason | None
    slot: int | None
    prompt_tokens: int
    cached_tokens: int
    prefill_done: int
    output_tokens: int
    max_tokens: int | None
    timings: RequestTimings
    finish_reason: str | None = None
    kind: str | None = None
    constraint: str | None = None  # json_schema, json_object, regex, choice, grammar, tool_call
    model: str | None = None  # the model serving it, where the server has several
    # the route it came through (/v1/chat/completions, /v1/messages, /api/chat...);
    # None for the chat page's
    endpoint: str | None = None


class RequestList(Struct):
    data: list[RequestInfo]
    object: str = "list"


class CancelResult(Struct):
    id: str
    cancelled: bool
    state: str


def live_info(view: RequestView, item: Tracked | None) -> RequestInfo:
    reason = Reason(view.reason.code, view.reason.text) if view.reason else None
    return RequestInfo(
        view.id, view.owner, view.state, view.phase, view.position, reason, view.slot,
        view.prompt_tokens, view.cached_tokens, view.prefill_done, view.output_tokens,
        view.max_tokens, RequestTimings(waited=view.waited, ttft=view.ttft, itl=view.itl,
                                        total=view.total),
        view.finish_reason, item.kind if item else None, view.constraint, view.model,
        item.endpoint if item else None)


def finished_info(item: Tracked, view: RequestView | None) -> RequestInfo:
    """An ended request from the engine's final report (and its last view, when kept)."""
    h, final = item.handle, item.handle.final
    usage = final.usage if final else None
    t = final.timings if final else None
    timings = RequestTimings(waited=t.queued, ttft=t.ttft, tpot=t.tpot, total=t.total) \
        if t else RequestTimings()
    outputs = usage.completion_tokens if usage else len(h.token_ids)
    prefill_done = view.prefill_done if view is not None else \
        (h.prompt_tokens if outputs else 0)
    return RequestInfo(
        h.id, h.owner, "finished", "finished", None, None, None, h.prompt_tokens,
        usage.cached_tokens if usage else 0, prefill_done, outputs, None, timings,
        final.finish_reason if final else "cancelled", item.kind, item.constraint,
        endpoint=item.endpoint)


def find(s: Services, user: User, request_id: str) -> RequestInfo:
    item = s.tracker.get(request_id)
    view = s.engine.snapshot().find(request_id)
    if item is not None and item.handle.final is not None and user.can_manage(item.owner):
        return finished_info(item, view)  # the engine's own report: every timing, the usage
    if view is not None and user.can_manage(view.owner):
        return live_info(view, item)
    if item is not None and user.can_manage(item.owner):
        if s.engine.handle(request_id) is not None:  # submitted, not yet in a snapshot
            return RequestInfo(request_id, item.owner, "waiting", "waiting", None, None, None,
                               item.handle.prompt_tokens, 0, 0, 0, None, RequestTimings(),
                               None, item.kind, endpoint=item.endpoint)
        return finished_info(item, None)
    raise APIError(f"no request {request_id}", 404, param="id", code="request_not_found")


def ended(s: Services, request_id: str) -> bool:
    """Whether the engine let go of the request and a snapshot says it finished."""
    if s.engine.handle(request_id) is not None:
        return False
    view = s.engine.snapshot().find(request_id)
    return view is None or view.state == "finished"


class RequestsController(Controller):
    path = "/v1/requests"
    tags = ("Requests",)

    @get("/", summary="Waiting and running requests (yours; all for an admin)")
    async def list_requests(self, request: Request[Any, Any, Any]) -> RequestList:
        s, user = services(request), current_user(request)
        snap = s.engine.snapshot()
        seen: set[str] = set()
        data = []
        for view in (*snap.running, *snap.waiting):
            if view.id not in seen and user.can_manage(view.owner):
                seen.add(view.id)
                data.append(live_info(view, s.tracker.get(view.id)))
        return RequestList(data)

    @get("/{request_id:str}", responses=error_docs(404),
         summary="One request: state, queue position and reason, progress, timings")
    async def get_request(self, request: Request[Any, Any, Any],
                          request_id: FromPath[str]) -> RequestInfo:
        return find(services(request), current_user(request), request_id)

    @delete("/{request_id:str}", status_code=200, responses=error_docs(404),
            summary="Cancel a request and answer its state once ended (404 when unknown; "
                    "`cancelled` false when it had ended already)")
    async def cancel_request(self, request: Request[Any, Any, Any],
                             request_id: FromPath[str]) -> CancelResult:
        s, user = services(request), current_user(request)
        info = find(s, user, request_id)
        cancelled = info.state != "finished" and s.engine.cancel(request_id)
        if cancelled:  # answer what a GET will say: wait for the round boundary that ends it
            with anyio.move_on_after(CANCEL_WAIT):
                while not ended(s, request_id):
                    await anyio.sleep(0.01)
            try:
                info = find(s, user, request_id)
            except APIError:  # announced, never submitted (its model loading): gone at once
                return CancelResult(request_id, True, "finished")
        return CancelResult(request_id, cancelled, info.state)

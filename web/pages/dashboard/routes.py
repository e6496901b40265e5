"""The live dashboard: one page, a board pushed over SSE, per-request cancel buttons."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import anyio
from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, URLEncodedBody
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Redirect, Template
from markupsafe import escape
from msgspec import Struct
from sse_starlette import EventSourceResponse, ServerSentEvent

from engine import ADMISSIONS, POLICIES
from web.access.identity import User, admin_guard, current_user
from web.api.controls import apply_policy
from web.api.errors import APIError
from web.pages.dashboard.board import board_context
from web.services import Services, services
from web.sse import event_stream, html_event


def owner_of(s: Services, request_id: str) -> str | None:
    handle = s.engine.handle(request_id)
    if handle is not None:
        return str(handle.owner)
    view = s.engine.snapshot().find(request_id)
    return view.owner if view is not None else None


async def board_events(s: Services, user: User, shutdown: anyio.Event,
                       model: str | None = None) -> AsyncIterator[ServerSentEvent]:
    """The board whenever the engine published a new snapshot, at most every
    `dashboard_interval` seconds; nothing while idle (the response pings keep it open)."""
    last = s.engine.snapshot()
    while not shutdown.is_set():
        with anyio.move_on_after(s.config.dashboard_interval):
            await shutdown.wait()
        snap = s.engine.snapshot()
        if snap is last:
            continue
        last = snap
        yield html_event("board", s.render("_board.html", **board_context(
            snap, s.engine, user, s.tracker, model)))


def chosen_model(s: Services, model: str | None) -> str | None:
    """A served model's name from the page's selector; anything else: the default's view."""
    return model if s.catalog is not None and model in s.catalog.names else None


class HTTPError(Struct):
    """Litestar's own error body (the dashboard is a page, not the OpenAI-style API)."""

    status_code: int
    detail: str
    extra: dict[str, Any] | list[Any] | None = None


@dataclass
class PolicyForm:
    policy: str = ""
    admission: str = ""
    csrf_token: str = ""  # checked by web.access.auth's middleware (shared mode)


@dataclass
class ModelActionForm:
    model: str = ""
    action: str = ""  # load | unload
    csrf_token: str = ""


LOAD_POLL_S = 1


def load_status(s: Services, model: str) -> str:
    """The status line after Load: while the model loads (or waits for memory to load), a
    line that asks again in a second (htmx replaces it); then what came of it."""
    assert s.catalog is not None  # and `model` one of its names: the callers check
    info = next(m for m in s.catalog.models() if m.name == model)
    name = escape(model)
    if info.state == "loading" or info.memory_wait:
        url = escape("/dashboard/models/status?" + urlencode({"model": model}))
        return (f'<span hx-get="{url}" hx-trigger="load delay:{LOAD_POLL_S}s" '
                f'hx-swap="outerHTML">Loading {name}…</span>')
    if info.error:
        return f"{name} did not load: {escape(info.error)}"
    return f"Loaded {name}." if info.loaded else f"{name} is {escape(info.state)}."


class DashboardController(Controller):
    path = "/dashboard"
    tags = ("Dashboard",)

    @get("/", include_in_schema=False, name="dashboard:page")
    async def page(self, request: Request[Any, Any, Any],
                   model: FromQuery[str | None] = None) -> Template:
        """`model` (several models): whose rounds and charts the board shows."""
        s, user = services(request), current_user(request)
        model = chosen_model(s, model)
        context = board_context(s.engine.snapshot(), s.engine, user, s.tracker, model)
        return Template("dashboard.html", context={
            **context, "page": "dashboard", "model_name": s.config.model_name,
            "stream_url": "/dashboard/stream" + (f"?{urlencode({'model': model})}"
                                                 if model else ""),
            "model_names": s.catalog.names if s.catalog else [],
            "policies": POLICIES, "admissions": ADMISSIONS})

    @post("/policy", status_code=200, guards=[admin_guard], name="dashboard:policy",
          include_in_schema=False)
    async def policy(self, request: HTMXRequest,
                     data: URLEncodedBody[PolicyForm]) -> Response[Any]:
        """The admin's policy control: a short status line for htmx, else back to the page."""
        try:
            info = apply_policy(services(request), data.policy, data.admission)
        except APIError as exc:
            return Response(str(escape(exc.message)), status_code=400, media_type="text/html")
        if not request.htmx:
            return Redirect("/dashboard", status_code=303)
        return Response(str(escape(f"Policy {info.policy}, admission {info.admission}: "
                                   "applies from the next round.")), media_type="text/html")

    @post("/models", status_code=200, guards=[admin_guard], name="dashboard:models",
          include_in_schema=False)
    async def models(self, request: HTMXRequest,
                     data: URLEncodedBody[ModelActionForm]) -> Response[Any]:
        """The admin's Load and Unload (several models): a status line for htmx."""
        s = services(request)
        if s.catalog is None or data.model not in s.catalog.names or \
                data.action not in ("load", "unload"):
            return Response("no such model or action", status_code=400, media_type="text/html")
        if data.action == "load":
            s.catalog.load(data.model)
            html, status = load_status(s, data.model), 200
        elif await anyio.to_thread.run_sync(s.catalog.unload, data.model):
            html, status = str(escape(f"Unloaded {data.model}.")), 200
        else:
            html, status = str(escape(f"{data.model} is not loaded, or has requests: not "
                                      "unloaded.")), 409
        if not request.htmx:
            return Redirect("/dashboard", status_code=303)
        return Response(html, status_code=status, media_type="text/html")

    @get("/models/status", guards=[admin_guard], name="dashboard:model-status",
         include_in_schema=False)
    async def model_status(self, request: Request[Any, Any, Any],
                           model: FromQuery[str] = "") -> Response[str]:
        """The Load button's status line while the model loads (it polls itself)."""
        s = services(request)
        if s.catalog is None or model not in s.catalog.names:
            return Response("no such model", status_code=400, media_type="text/html")
        return Response(load_status(s, model), media_type="text/html")

    @get("/stream", media_type="text/event-stream", name="dashboard:stream",
         summary="The dashboard board as HTML fragments (event `board`), while it changes")
    async def stream(self, request: Request[Any, Any, Any],
                     model: FromQuery[str | None] = None) -> EventSourceResponse:
        s, user = services(request), current_user(request)
        model = chosen_model(s, model)
        return event_stream(lambda shutdown: board_events(s, user, shutdown, model))

    @post("/requests/{request_id:str}/cancel", status_code=204, name="dashboard:cancel",
          responses={404: ResponseSpec(HTTPError, description="No live request with this id "
                                       "that the viewer may cancel", generate_examples=False)},
          summary="Cancel a waiting or running request (the viewer's own; any for an admin)")
    async def cancel(self, request: Request[Any, Any, Any], request_id: FromPath[str]) -> None:
        s, user = services(request), current_user(request)
        owner = owner_of(s, request_id)
        if owner is None or not user.can_manage(owner):
            raise NotFoundException(f"no live request {request_id}")
        item = s.tracker.get(request_id)
        if item is not None and owner != user.name:  # the owner's chat says who it was
            item.cancelled_by = f"{user.name} (admin)"
        if not s.engine.cancel(request_id):
            if item is not None and owner != user.name:
                item.cancelled_by = None
            raise NotFoundException(f"no live request {request_id}")

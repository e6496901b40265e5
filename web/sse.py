"""Server-sent events: sse-starlette responses returned from ordinary Litestar handlers.

EventSourceResponse sends keep-alive pings, cancels the generator when the client leaves
(its `finally:` then cancels the engine request), and on server shutdown sets the stream's
`shutdown` event: the generator then has SHUTDOWN_GRACE seconds to end cleanly (an API
stream cancels its request and still sends its last chunk and `[DONE]`) before it is
cancelled.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Schema
from markupsafe import escape
from sse_starlette import EventSourceResponse, ServerSentEvent

PING_SECONDS = 15
REF = "#/components/schemas/{name}"
SHUTDOWN_GRACE = 2.0  # below uvicorn's graceful-shutdown timeout


@dataclass(frozen=True, slots=True)
class EventDoc:
    """How the OpenAPI schema describes one event of a stream (see document_event_streams)."""

    description: str
    json: tuple[type, ...] = ()  # `data` is one of these structs, as JSON
    constants: tuple[str, ...] = ()  # ... or one of these strings


def event_stream(make_events: Callable[[anyio.Event], AsyncIterable[Any]],
                 headers: dict[str, str] | None = None,
                 ping: float = PING_SECONDS) -> EventSourceResponse:
    """An SSE response over `make_events(shutdown)`; `shutdown` is set when the server stops."""
    shutdown = anyio.Event()
    return EventSourceResponse(make_events(shutdown), headers=headers, ping=ping,
                               shutdown_event=shutdown, shutdown_grace_period=SHUTDOWN_GRACE)


def on_event(event: anyio.Event, callback: Callable[[], object]) -> asyncio.Task[None]:
    """Run `callback` once `event` is set (cancel the task to forget it)."""
    async def wait() -> None:
        await event.wait()
        callback()
    return asyncio.get_running_loop().create_task(wait())


def html_event(event: str, html: str) -> ServerSentEvent:
    """A named event whose data is an HTML fragment (for htmx `sse-swap`)."""
    return ServerSentEvent(data=html, event=event)


def text_event(event: str, text: str) -> ServerSentEvent:
    """Untrusted text (model output), escaped so htmx inserts it as text, never as markup."""
    return ServerSentEvent(data=str(escape(text)), event=event)


def done_event() -> ServerSentEvent:
    """The last event of a page stream; the page closes on it (`sse-close="done"`), so the
    browser does not reconnect."""
    return ServerSentEvent(data="done", event="done")


async def until_disconnect(request: ASGIConnection[Any, Any, Any, Any]) -> None:
    """Return when the client has gone (call after the request body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def document_event_streams(app: Litestar, paths: dict[tuple[str, str], EventDoc]) -> None:
    """Add `text/event-stream` to the 200 response of each (path, method) in the OpenAPI
    schema, next to the JSON body Litestar documents from the handler's ResponseSpec.

    Before OpenAPI 3.2 the schema of an event stream describes one event: an object with
    `data` (and `event`, `id`, `retry`). `data` is a JSON document of one of the given
    structs (their schemas become components) or one of the given constant strings."""
    schema = app.openapi_schema
    components = schema.components.schemas if schema.components else None
    for (path, method), doc in paths.items():
        item = schema.paths.get(path) if schema.paths else None
        operation = getattr(item, method.lower(), None) if item else None
        responses = getattr(operation, "responses", None) or {}
        ok = responses.get("200")
        if ok is None or isinstance(ok, dict) or not hasattr(ok, "content"):
            continue
        ok.content = dict(ok.content or {})
        ok.content["text/event-stream"] = OpenAPIMediaType(schema=_event_schema(doc, components))


def _event_schema(doc: EventDoc, components: dict[str, Any] | None) -> Schema:
    data: dict[str, Any] = {"type": "string"}
    if doc.json:
        refs, defs = msgspec.json.schema_components(doc.json, ref_template=REF)
        if components is not None:
            for name, definition in defs.items():
                components.setdefault(name, definition)
        content = {"contentMediaType": "application/json",
                   "contentSchema": refs[0] if len(refs) == 1 else {"anyOf": list(refs)}}
        data = {"anyOf": [{"const": c} for c in doc.constants] + [{**data, **content}]}
    elif doc.constants:
        data = {"anyOf": [{"const": c} for c in doc.constants] + [data]}
    return Schema(type=OpenAPIType.OBJECT, description=doc.description, required=["data"],
                  properties={"data": data,  # type: ignore[dict-item]  # plain JSON schema
                              "event": Schema(type=OpenAPIType.STRING),
                              "id": Schema(type=OpenAPIType.STRING),
                              "retry": Schema(type=OpenAPIType.INTEGER)})

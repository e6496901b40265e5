"""Chat pages: the conversation list, a conversation, sending, streaming, stop, regenerate."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from litestar import Controller, Response, delete, get, post
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import FromPath, URLEncodedBody
from litestar.plugins.htmx import ClientRedirect, HTMXRequest, HTMXTemplate
from litestar.response import Redirect, Template
from sse_starlette import EventSourceResponse, ServerSentEvent

from engine import QueueFull, RequestError
from web.access.identity import User, current_user
from web.pages.chat_service import ChatError, ChatService
from web.services import EngineUnavailable, Services, services
from web.sse import done_event, event_stream, html_event, on_event, text_event
from web.storage.store import Conversation


@dataclass
class ChatForm:
    content: str
    csrf_token: str = ""  # checked by web.access.auth's middleware (shared mode)


Form = URLEncodedBody[ChatForm]


def page(request: HTMXRequest, user: User, conv: Conversation | None,
         notice: str | None = None, status_code: int = 200) -> Template:
    s = services(request)
    return Template("chat.html", status_code=status_code, context={
        "page": "chat", "user": user, "model_name": s.config.model_name, "notice": notice,
        "conversations": s.store.conversations(user.name), "conversation": conv,
        "messages": s.store.messages(conv.id) if conv else []})


def refusal(request: HTMXRequest, exc: Exception, conv: Conversation | None) -> Response[Any]:
    """Why an action was refused: a notice swapped into the page, or the page with it."""
    status = 400
    headers: dict[str, str] = {}
    if isinstance(exc, ChatError):
        status = exc.status_code
    elif isinstance(exc, (QueueFull, EngineUnavailable)):
        status = 429 if isinstance(exc, QueueFull) else 503
        headers = {"Retry-After": str(exc.retry_after)}
    if request.htmx:
        return HTMXTemplate(template_name="_notice.html", context={"notice": str(exc)},
                            status_code=status, headers=headers, re_target="#notice",
                            re_swap="innerHTML")
    response = page(request, current_user(request), conv, str(exc), status)
    response.headers.update(headers)
    return response


REFUSED = (ChatError, RequestError, QueueFull, EngineUnavailable)


def http_error(request: HTMXRequest, exc: HTTPException) -> Response[Any]:
    """A 404 or 413 on a chat route: a notice in the page, never a JSON body in the chat."""
    detail = "the message is too long" if exc.status_code == 413 else str(exc.detail)
    return refusal(request, ChatError(detail, exc.status_code), None)


class ChatController(Controller):
    include_in_schema = False
    exception_handlers = {HTTPException: http_error}  # noqa: RUF012 (Litestar's layer API)

    def _find(self, request: HTMXRequest, conversation_id: int,
              message_id: int | None = None) -> tuple[ChatService, Conversation, Any]:
        chat = ChatService(services(request))
        conv = chat.conversation(current_user(request), conversation_id)
        msg = chat.message(conv, message_id) if conv and message_id is not None else None
        if conv is None or (message_id is not None and msg is None):
            raise NotFoundException("no such conversation or message")
        return chat, conv, msg

    @get("/", name="chat:index")
    async def index(self, request: HTMXRequest) -> Template:
        return page(request, current_user(request), None)

    @get("/c/{conversation_id:int}", name="chat:conversation")
    async def conversation(self, request: HTMXRequest, conversation_id: FromPath[int]) -> Template:
        _, conv, _ = self._find(request, conversation_id)
        return page(request, current_user(request), conv)

    @post("/c", name="chat:create")
    async def create(self, request: HTMXRequest, data: Form) -> Response[Any]:
        chat = ChatService(services(request))
        try:
            conv, _, _ = await chat.create(current_user(request), data.content)
        except REFUSED as exc:
            return refusal(request, exc, None)
        if request.htmx:
            return ClientRedirect(f"/c/{conv.id}")
        return Redirect(f"/c/{conv.id}", status_code=303)

    @post("/c/{conversation_id:int}/messages", name="chat:send")
    async def send(self, request: HTMXRequest, conversation_id: FromPath[int],
                   data: Form) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        try:
            mine, reply = await chat.send(current_user(request), conv, data.content)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return HTMXTemplate(template_name="_messages.html",
                            context={"messages": [mine, reply], "conversation": conv})

    @post("/c/{conversation_id:int}/messages/{message_id:int}/stop", status_code=204,
          name="chat:stop")
    async def stop(self, request: HTMXRequest, conversation_id: FromPath[int],
                   message_id: FromPath[int]) -> None:
        chat, _, msg = self._find(request, conversation_id, message_id)
        chat.stop(msg)

    @post("/c/{conversation_id:int}/messages/{message_id:int}/regenerate",
          name="chat:regenerate")
    async def regenerate(self, request: HTMXRequest, conversation_id: FromPath[int],
                         message_id: FromPath[int]) -> Response[Any]:
        chat, conv, msg = self._find(request, conversation_id, message_id)
        try:
            reply = await chat.regenerate(current_user(request), conv, msg)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return HTMXTemplate(template_name="_messages.html",
                            context={"messages": [reply], "conversation": conv})

    @delete("/c/{conversation_id:int}", status_code=200, name="chat:delete")
    async def delete(self, request: HTMXRequest, conversation_id: FromPath[int]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        chat.delete(conv)
        return ClientRedirect("/")

    @get("/c/{conversation_id:int}/messages/{message_id:int}/stream", name="chat:stream")
    async def stream(self, request: HTMXRequest, conversation_id: FromPath[int],
                     message_id: FromPath[int]) -> EventSourceResponse:
        _, conv, msg = self._find(request, conversation_id, message_id)
        s = services(request)
        return event_stream(lambda shutdown: reply_events(s, conv, msg.id, shutdown))


async def reply_events(s: Services, conv: Conversation, message_id: int,
                       shutdown: anyio.Event) -> AsyncIterator[ServerSentEvent]:
    """Text so far, each new delta, then the finished message (rendered Markdown) and `done`.

    Idempotent: a finished reply gets its final form and `done` at once. Leaving (the
    generator is cancelled) lets the reply's grace timer cancel it if nobody comes back.
    On server shutdown the stream just ends: the page reconnects when the server is back
    and gets the reply as it was saved.
    """
    reply = s.replies.get(message_id)
    if reply is not None and not reply.done:
        text, queue = reply.subscribe()
        watcher = on_event(shutdown, lambda: queue.put_nowait(("shutdown", "")))
        try:
            if text:
                yield text_event("token", text)
            while True:
                kind, payload = await queue.get()
                if kind == "shutdown":
                    return
                if kind != "token":
                    break
                yield text_event("token", payload)
        finally:
            watcher.cancel()
            reply.unsubscribe(queue)
    msg = s.store.message(message_id)
    if msg is not None:
        yield html_event("final", s.render("_messages.html", messages=[msg], conversation=conv))
    yield done_event()

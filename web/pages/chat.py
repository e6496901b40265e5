"""Chat pages: the conversation list (and its search), a conversation, sending, editing,
streaming, Stop, regenerate (versions), Continue, settings, rename, export and import."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import Body, FromPath, FromQuery, URLEncodedBody
from litestar.plugins.htmx import ClientRedirect, HTMXRequest, HTMXTemplate
from litestar.response import Redirect, Template
from sse_starlette import EventSourceResponse

from engine import QueueFull, RequestError
from web.access.identity import User, current_user
from web.pages import transfer
from web.pages.chat_service import ChatError, ChatService, version_nav
from web.pages.replies import reply_events
from web.services import EngineUnavailable, services
from web.sse import event_stream
from web.storage.store import Conversation, Message


@dataclass
class ChatForm:
    content: str
    csrf_token: str = ""  # checked by web.access.auth's middleware (shared mode)


@dataclass
class TitleForm:
    title: str
    csrf_token: str = ""


@dataclass
class SettingsForm:
    system_prompt: str = ""
    temperature: str = ""
    top_p: str = ""
    max_tokens: str = ""
    csrf_token: str = ""


@dataclass
class ImportForm:
    file: UploadFile
    csrf_token: str = ""


Form = URLEncodedBody[ChatForm]


def sidebar(request: HTMXRequest, user: User, conv: Conversation | None,
            search: str | None = None) -> dict[str, Any]:
    s = services(request)
    return {"conversations": s.store.conversations(user.name, search=search),
            "live": s.replies.live_conversations(), "conversation": conv, "search": search or ""}


def page(request: HTMXRequest, user: User, conv: Conversation | None,
         notice: str | None = None, status_code: int = 200, draft: str = "",
         search: str | None = None) -> Template:
    s = services(request)
    messages = s.store.messages(conv.id) if conv else []
    cfg = s.config
    return Template("chat.html", status_code=status_code, context={
        "page": "chat", "user": user, "model_name": cfg.model_name, "notice": notice,
        "messages": messages, "versions": version_nav(s, messages), "draft": draft,
        "defaults": {"system_prompt": cfg.chat_system_prompt or "", "temperature":
                     cfg.chat_temperature, "top_p": cfg.chat_top_p,
                     "max_tokens": cfg.default_max_tokens},
        **sidebar(request, user, conv, search)})


def fragment(request: HTMXRequest, conv: Conversation, messages: list[Message]) -> HTMXTemplate:
    return HTMXTemplate(template_name="_messages.html", context={
        "messages": messages, "conversation": conv,
        "versions": version_nav(services(request), messages)})


def refusal(request: HTMXRequest, exc: Exception, conv: Conversation | None,
            draft: str = "") -> Response[Any]:
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
    response = page(request, current_user(request), conv, str(exc), status, draft)
    response.headers.update(headers)
    return response


REFUSED = (ChatError, RequestError, QueueFull, EngineUnavailable)


def http_error(request: HTMXRequest, exc: HTTPException) -> Response[Any]:
    """A 404 or 413 on a chat route: a notice in the page, never a JSON body in the chat."""
    detail = "the message is too long" if exc.status_code == 413 else str(exc.detail)
    return refusal(request, ChatError(detail, exc.status_code), None)


def go(request: HTMXRequest, url: str) -> Response[Any]:
    return ClientRedirect(url) if request.htmx else Redirect(url, status_code=303)


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
    async def index(self, request: HTMXRequest, q: FromQuery[str | None] = None) -> Template:
        return page(request, current_user(request), None, search=q)

    @get("/conversations", name="chat:search")
    async def search(self, request: HTMXRequest, q: FromQuery[str] = "",
                     current: FromQuery[int | None] = None) -> Template:
        """The sidebar's list, filtered by title and content (the search box)."""
        user = current_user(request)
        conv = ChatService(services(request)).conversation(user, current) if current else None
        return HTMXTemplate(template_name="_conversations.html",
                            context=sidebar(request, user, conv, q.strip()[:200] or None))

    @get("/c", name="chat:new")
    async def new(self) -> Redirect:
        return Redirect("/")  # a reload after a refused first message lands on a fresh chat

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
            return refusal(request, exc, None, data.content)
        return go(request, f"/c/{conv.id}")

    @post("/c/{conversation_id:int}/messages", name="chat:send")
    async def send(self, request: HTMXRequest, conversation_id: FromPath[int],
                   data: Form) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        try:
            mine, reply = await chat.send(current_user(request), conv, data.content)
        except REFUSED as exc:
            return refusal(request, exc, conv, data.content)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return fragment(request, conv, [mine, reply])

    @post("/c/{conversation_id:int}/messages/{message_id:int}/edit", name="chat:edit")
    async def edit(self, request: HTMXRequest, conversation_id: FromPath[int],
                   message_id: FromPath[int], data: Form) -> Response[Any]:
        chat, conv, msg = self._find(request, conversation_id, message_id)
        try:
            await chat.edit(current_user(request), conv, msg, data.content)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return fragment(request, conv, chat.s.store.messages(conv.id))

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
        return fragment(request, conv, [reply])

    @post("/c/{conversation_id:int}/messages/{message_id:int}/continue", name="chat:continue")
    async def continue_reply(self, request: HTMXRequest, conversation_id: FromPath[int],
                             message_id: FromPath[int]) -> Response[Any]:
        chat, conv, msg = self._find(request, conversation_id, message_id)
        try:
            reply = await chat.continue_reply(current_user(request), conv, msg)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return fragment(request, conv, [reply])

    @post("/c/{conversation_id:int}/messages/{message_id:int}/show", name="chat:show")
    async def show(self, request: HTMXRequest, conversation_id: FromPath[int],
                   message_id: FromPath[int]) -> Response[Any]:
        """Switch to another version of the last reply (‹1/2›)."""
        chat, conv, msg = self._find(request, conversation_id, message_id)
        try:
            chat.show_version(conv, msg)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        shown = chat.s.store.message(msg.id)
        assert shown is not None
        return fragment(request, conv, [shown])

    @post("/c/{conversation_id:int}/rename", name="chat:rename")
    async def rename(self, request: HTMXRequest, conversation_id: FromPath[int],
                     data: URLEncodedBody[TitleForm]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        try:
            chat.rename(conv, data.title)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        return go(request, f"/c/{conv.id}")

    @post("/c/{conversation_id:int}/settings", name="chat:settings")
    async def settings(self, request: HTMXRequest, conversation_id: FromPath[int],
                       data: URLEncodedBody[SettingsForm]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        try:
            chat.set_settings(conv, data.system_prompt, data.temperature, data.top_p,
                              data.max_tokens)
        except REFUSED as exc:
            return refusal(request, exc, conv)
        if request.htmx:
            return HTMXTemplate(template_name="_notice.html", context={
                "notice": "Settings saved: they apply from the next reply", "kind": "ok"},
                re_target="#notice", re_swap="innerHTML")
        return Redirect(f"/c/{conv.id}", status_code=303)

    @get("/c/{conversation_id:int}/export.json", name="chat:export_json")
    async def export_json(self, request: HTMXRequest,
                          conversation_id: FromPath[int]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        body = transfer.to_json(conv, chat.s.store.messages(conv.id))
        return Response(body, headers={
            "Content-Disposition": f'attachment; filename="conversation-{conv.id}.json"'})

    @get("/c/{conversation_id:int}/export.md", name="chat:export_md")
    async def export_md(self, request: HTMXRequest,
                        conversation_id: FromPath[int]) -> Response[str]:
        chat, conv, _ = self._find(request, conversation_id)
        text = transfer.to_markdown(conv, chat.s.store.messages(conv.id))
        return Response(text, media_type="text/markdown; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="conversation-{conv.id}.md"'})

    @post("/import", name="chat:import")
    async def import_json(self, request: HTMXRequest, data: Annotated[
            ImportForm, Body(media_type=RequestEncodingType.MULTI_PART)]) -> Response[Any]:
        s = services(request)
        raw = await data.file.read()
        try:
            if len(raw) > s.config.max_body_bytes:
                raise ChatError("the file is too large", 413)
            conv = transfer.from_json(s.store, current_user(request).name, raw,
                                      s.config.max_messages)
        except ChatError as exc:
            return refusal(request, exc, None)
        return go(request, f"/c/{conv.id}")

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

"""Chat pages: the conversation list (and its search), a conversation, sending, editing,
streaming, Stop, regenerate (versions), Continue, settings, rename, export and import."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio
from litestar import Controller, Response, delete, get, post
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import Body, FromPath, FromQuery, URLEncodedBody
from litestar.plugins.htmx import ClientRedirect, HTMXRequest, HTMXTemplate
from litestar.response import Redirect, Template
from sse_starlette import EventSourceResponse

from web.access.identity import current_user
from web.pages.chat import transfer
from web.pages.chat.replies import replies, reply_events
from web.pages.chat.rules import latest_page
from web.pages.chat.service import ChatError, ChatService
from web.pages.chat.uploads import checked_images
from web.pages.chat.views import (
    REFUSED,
    Form,
    ImportForm,
    ModelForm,
    SettingsForm,
    TitleForm,
    ahead,
    composed,
    fragment,
    go,
    http_error,
    page,
    refused,
    shown,
    sidebar,
)
from web.services import services
from web.sse import event_stream
from web.storage.store import Conversation, Message
from web.worker import below_engine


async def new_reply(request: HTMXRequest, conv: Conversation,
                    starting: Awaitable[Message]) -> Response[Any]:
    """What Regenerate and Continue answer: the refusal, a redirect for a plain form, or the
    new reply's fragment for htmx."""
    try:
        reply = await starting
    except REFUSED as exc:
        return await refused(request, exc, conv)
    if not request.htmx:
        return Redirect(f"/c/{conv.id}", status_code=303)
    return await fragment(request, conv, [reply])


class ChatController(Controller):
    include_in_schema = False
    # Litestar types handlers with the base Request, though the HTMX plugin makes every
    # request an HTMXRequest; RUF012: a class attribute is Litestar's layer API
    exception_handlers = {HTTPException: http_error}  # type: ignore[dict-item]  # noqa: RUF012

    def _find(self, request: HTMXRequest, conversation_id: int,
              message_id: int | None = None) -> tuple[ChatService, Conversation, Any]:
        chat = ChatService(services(request), replies(request))
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
        chat = ChatService(services(request), replies(request))
        conv = chat.conversation(user, current) if current else None
        return HTMXTemplate(template_name="_conversations.html",
                            context=sidebar(request, user, conv, q.strip()[:200] or None))

    @get("/c", name="chat:new")
    async def new(self) -> Redirect:
        return Redirect("/")  # a reload after a refused first message lands on a fresh chat

    @get("/c/{conversation_id:int}", name="chat:conversation")
    async def conversation(self, request: HTMXRequest, conversation_id: FromPath[int],
                           unknown_model: FromQuery[str | None] = None) -> Template:
        chat, conv, _ = self._find(request, conversation_id)
        # opens the conversation's model's tokenizer (seconds, the first time) off the event
        # loop: the page's Thinking switch follows that model's template. A model that fails
        # to open says so when a reply is asked of it; the page shows regardless.
        with contextlib.suppress(ChatError):
            await anyio.to_thread.run_sync(chat.for_conversation, conv)
        notice = None
        if unknown_model and not conv.model:  # after an import (see import_json)
            notice = (f"This conversation was written with {unknown_model[:200]}, which this "
                      f"server does not serve: it goes on with {chat.s.config.model_name}.")
        # read once, below the engine: a megabyte conversation is many rows to build
        showing = await below_engine(shown, chat.s, conv)
        await ahead(showing[0])
        return page(request, current_user(request), conv, notice, showing=showing)

    @get("/c/{conversation_id:int}/earlier", name="chat:earlier")
    async def earlier(self, request: HTMXRequest, conversation_id: FromPath[int],
                      before: FromQuery[int]) -> Response[Any]:
        """The page of messages before message `before` (the page's Show earlier)."""
        chat, conv, _ = self._find(request, conversation_id)
        messages, more = latest_page([m for m in chat.s.store.messages(conv.id)
                                      if m.id < before])
        return await fragment(request, conv, messages, more)

    @post("/c", name="chat:create")
    async def create(self, request: HTMXRequest) -> Response[Any]:
        """A new chat from the composer (its text, pictures and model)."""
        chat = ChatService(services(request), replies(request))
        data = await composed(request)
        try:
            pictures = await below_engine(checked_images, data.files,
                                                      chat.s.config)
            conv, _, _ = await chat.create(current_user(request), data.content, data.model,
                                           pictures)
        except REFUSED as exc:
            return await refused(request, exc, None, data.content)
        return go(request, f"/c/{conv.id}")

    @post("/c/{conversation_id:int}/messages", name="chat:send")
    async def send(self, request: HTMXRequest, conversation_id: FromPath[int]) -> Response[Any]:
        """The composer's message (its text and pictures) and the reply it asks for."""
        chat, conv, _ = self._find(request, conversation_id)
        data = await composed(request)
        try:
            pictures = await anyio.to_thread.run_sync(
                checked_images, data.files, chat.s.config, chat.s.store.image_bytes(conv.id))
            mine, reply = await chat.send(current_user(request), conv, data.content, pictures)
        except REFUSED as exc:
            return await refused(request, exc, conv, data.content)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return await fragment(request, conv, [mine, reply])

    @post("/c/{conversation_id:int}/messages/{message_id:int}/edit", name="chat:edit")
    async def edit(self, request: HTMXRequest, conversation_id: FromPath[int],
                   message_id: FromPath[int], data: Form) -> Response[Any]:
        chat, conv, msg = self._find(request, conversation_id, message_id)
        try:
            await chat.edit(current_user(request), conv, msg, data.content)
        except REFUSED as exc:
            return await refused(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        return await fragment(request, conv, *shown(chat.s, conv))

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
        return await new_reply(request, conv, chat.regenerate(current_user(request), conv, msg))

    @post("/c/{conversation_id:int}/messages/{message_id:int}/continue", name="chat:continue")
    async def continue_reply(self, request: HTMXRequest, conversation_id: FromPath[int],
                             message_id: FromPath[int]) -> Response[Any]:
        chat, conv, msg = self._find(request, conversation_id, message_id)
        return await new_reply(request, conv,
                               chat.continue_reply(current_user(request), conv, msg))

    @post("/c/{conversation_id:int}/messages/{message_id:int}/show", name="chat:show")
    async def show(self, request: HTMXRequest, conversation_id: FromPath[int],
                   message_id: FromPath[int]) -> Response[Any]:
        """Switch to another version of the last reply (‹1/2›)."""
        chat, conv, msg = self._find(request, conversation_id, message_id)
        try:
            chat.show_version(conv, msg)
        except REFUSED as exc:
            return await refused(request, exc, conv)
        if not request.htmx:
            return Redirect(f"/c/{conv.id}", status_code=303)
        version = chat.s.store.message(msg.id)
        assert version is not None
        return await fragment(request, conv, [version])

    @post("/c/{conversation_id:int}/rename", name="chat:rename")
    async def rename(self, request: HTMXRequest, conversation_id: FromPath[int],
                     data: URLEncodedBody[TitleForm]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        try:
            chat.rename(conv, data.title)
        except REFUSED as exc:
            return await refused(request, exc, conv)
        return go(request, f"/c/{conv.id}")

    @post("/c/{conversation_id:int}/model", name="chat:model")
    async def model(self, request: HTMXRequest, conversation_id: FromPath[int],
                    data: URLEncodedBody[ModelForm]) -> Response[Any]:
        """The conversation's model (several models): the next replies are written by it."""
        chat, conv, _ = self._find(request, conversation_id)
        try:
            chat.set_model(conv, data.model)
        except REFUSED as exc:
            return await refused(request, exc, conv)
        return go(request, f"/c/{conv.id}")

    @post("/c/{conversation_id:int}/settings", name="chat:settings")
    async def settings(self, request: HTMXRequest, conversation_id: FromPath[int],
                       data: URLEncodedBody[SettingsForm]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        try:
            chat.set_settings(conv, data.system_prompt, data.temperature, data.top_p,
                              data.max_tokens, data.thinking)
        except REFUSED as exc:
            return await refused(request, exc, conv)
        if request.htmx:
            return HTMXTemplate(template_name="_notice.html", context={
                "notice": "Settings saved: they apply from the next reply", "kind": "ok"},
                re_target="#notice", re_swap="innerHTML")
        return Redirect(f"/c/{conv.id}", status_code=303)

    @get("/c/{conversation_id:int}/images/{image_id:int}", name="chat:image")
    async def image(self, request: HTMXRequest, conversation_id: FromPath[int],
                    image_id: FromPath[int], thumb: FromQuery[bool] = False) -> Response[bytes]:
        """A picture of the conversation (`thumb`: its small preview), for its owner only."""
        chat, conv, _ = self._find(request, conversation_id)
        found = chat.s.store.image(image_id)
        data = chat.s.store.image_data(image_id, thumb) if found else None
        if found is None or found.conversation_id != conv.id or data is None:
            raise NotFoundException("no such picture")
        return Response(data, media_type=found.thumb_type if thumb else found.media_type,
                        headers={"Cache-Control": "private, max-age=86400"})

    @get("/c/{conversation_id:int}/export.json", name="chat:export_json")
    async def export_json(self, request: HTMXRequest,
                          conversation_id: FromPath[int]) -> Response[Any]:
        chat, conv, _ = self._find(request, conversation_id)
        messages = chat.s.store.messages(conv.id)
        model = conv.model or chat.s.config.model_name
        # pictures make it large: read, encoded and written off the event loop
        body = await anyio.to_thread.run_sync(lambda: json.dumps(
            transfer.to_json(conv, messages, model, chat.s.store)).encode())
        return Response(body, media_type="application/json", headers={
            "Content-Disposition": f'attachment; filename="conversation-{conv.id}.json"'})

    @get("/c/{conversation_id:int}/export.md", name="chat:export_md")
    async def export_md(self, request: HTMXRequest,
                        conversation_id: FromPath[int]) -> Response[str]:
        chat, conv, _ = self._find(request, conversation_id)
        text = transfer.to_markdown(conv, chat.s.store.messages(conv.id),
                                    conv.model or chat.s.config.model_name,
                                    chat.s.store.images(conv.id))
        return Response(text, media_type="text/markdown; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="conversation-{conv.id}.md"'})

    @post("/import", name="chat:import")
    async def import_json(self, request: HTMXRequest, data: Annotated[
            ImportForm, Body(media_type=RequestEncodingType.MULTI_PART)]) -> Response[Any]:
        s = services(request)
        raw = await data.file.read()
        try:
            if len(raw) > s.config.chat_body_bytes:
                raise ChatError("the file is too large", 413)
            conv, unknown = await below_engine(
                transfer.from_json, s.store, current_user(request).name, raw, s.config,
                ChatService(s, replies(request)).imported_model)
        except ChatError as exc:
            return await refused(request, exc, None)
        if unknown is not None:  # the page says the conversation goes on with the default
            return go(request, f"/c/{conv.id}?{urlencode({'unknown_model': unknown})}")
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
        live = replies(request)
        return event_stream(lambda shutdown: reply_events(s, live, conv, msg.id, shutdown))

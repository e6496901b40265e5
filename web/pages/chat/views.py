"""What the chat's routes answer with: its forms, the page, message fragments, and refusals
(a notice swapped into the page, or the page with the notice and the typed text kept)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Response
from litestar.datastructures import UploadFile
from litestar.exceptions import HTTPException
from litestar.params import URLEncodedBody
from litestar.plugins.htmx import ClientRedirect, HTMXRequest, HTMXTemplate
from litestar.response import Redirect, Template

from engine import LoadRefused, QueueFull, RequestError, UnknownModel
from web.access.disclosure import model_info
from web.access.identity import User, current_user
from web.pages.chat.replies import replies
from web.pages.chat.rules import ChatError, Earlier, latest_page, version_nav
from web.pages.chat.vision import model_takes_images, vision_models
from web.pages.rendered import render_ahead
from web.services import EngineUnavailable, Services, services
from web.storage.store import Conversation, Message


@dataclass
class ChatForm:
    content: str
    csrf_token: str = ""  # checked by web.access.auth's middleware (shared mode)
    model: str = ""  # a new chat's model (several models; "" = the default)


@dataclass
class ModelForm:
    model: str = ""
    csrf_token: str = ""


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
    thinking_switch: str = ""  # "1" when the form shows the Thinking checkbox
    enable_thinking: str = ""  # "on" when that checkbox is ticked
    csrf_token: str = ""

    @property
    def thinking(self) -> bool | None:
        return bool(self.enable_thinking) if self.thinking_switch else None


@dataclass
class ImportForm:
    file: UploadFile
    csrf_token: str = ""


Form = URLEncodedBody[ChatForm]


@dataclass(frozen=True, slots=True)
class Composed:
    """What the composer sent: its text, a new chat's model, the attached files (name,
    bytes). The composer posts multipart when it carries pictures, else urlencoded."""

    content: str
    model: str
    files: list[tuple[str, bytes]]


async def composed(request: HTMXRequest) -> Composed:
    form = await request.form()

    def text(name: str) -> str:
        value = form.get(name)
        return value if isinstance(value, str) else ""
    files = [(f.filename, await f.read()) for f in form.getall("images", [])
             if isinstance(f, UploadFile) and f.filename]  # an empty picker sends a bare name
    return Composed(text("content"), text("model"), files)


def sidebar(request: HTMXRequest, user: User, conv: Conversation | None,
            search: str | None = None) -> dict[str, Any]:
    s = services(request)
    return {"conversations": s.store.conversations(user.name, search=search),
            "live": replies(request).live_conversations(), "conversation": conv,
            "search": search or ""}


def thinking_switch(s: Services, conv: Conversation | None) -> bool:
    """Whether the Settings show the Thinking switch: the conversation's model's template
    takes enable_thinking (several models: its tokenizer, which the conversation's page
    opens off the event loop first; one not opened yet shows none)."""
    if s.catalog is None or conv is None:
        return bool(s.tokenizer.takes_enable_thinking)
    try:
        name = s.catalog.resolve(conv.model)
    except UnknownModel:
        name = s.catalog.default
    tokenizer = s.catalog.opened_tokenizer(name)
    return bool(tokenizer is not None and tokenizer.takes_enable_thinking)


def page(request: HTMXRequest, user: User, conv: Conversation | None,
         notice: str | None = None, status_code: int = 200, draft: str = "",
         search: str | None = None,
         showing: tuple[list[Message], Earlier | None] | None = None) -> Template:
    """The chat page; `showing`: the conversation's messages as `shown` read them already
    (a long conversation is read once, off the event loop)."""
    s = services(request)
    messages, earlier = showing if showing is not None else shown(s, conv)
    cfg = s.config
    models = [model_info(m, user) for m in s.catalog.models()] if s.catalog else []
    vision = vision_models(s)
    return Template("chat.html", status_code=status_code, context={
        "page": "chat", "user": user, "model_name": cfg.model_name, "notice": notice,
        "thinking_switch": thinking_switch(s, conv),
        # the configured models, then those found on disk (a group of their own)
        "models": [m for m in models if m.details.get("source", "configured") == "configured"],
        "disk_models": [m for m in models
                        if m.details.get("source", "configured") != "configured"],
        "conversation_model": (conv.model if conv else None) or cfg.model_name,
        "messages": messages, "earlier": earlier,
        "versions": version_nav(s.store, messages), "draft": draft,
        "images": s.store.images(conv.id) if conv else {},
        # the composer warns when pictures are attached for a model that takes none
        "sees_images": model_takes_images(s, conv.model if conv else None),
        "vision_models": vision,
        "defaults": {"system_prompt": cfg.chat_system_prompt or "", "temperature":
                     cfg.chat_temperature, "top_p": cfg.chat_top_p,
                     "max_tokens": cfg.default_max_tokens},
        **sidebar(request, user, conv, search)})


def shown(s: Services, conv: Conversation | None) -> tuple[list[Message], Earlier | None]:
    """What a conversation's page shows: its latest messages (rules.latest_page)."""
    return latest_page(s.store.messages(conv.id)) if conv else ([], None)


async def ahead(messages: list[Message]) -> None:
    """The replies' Markdown rendered on the worker thread (web.pages.rendered), before a
    template shows them: never on the event loop."""
    await render_ahead(text for m in messages if m.role == "assistant"
                       for text in (m.content, m.reasoning))


async def fragment(request: HTMXRequest, conv: Conversation, messages: list[Message],
                   earlier: Earlier | None = None) -> HTMXTemplate:
    """Messages to swap into the page (`earlier`: what is left before them, offered by a
    button above them)."""
    await ahead(messages)
    return HTMXTemplate(template_name="_messages.html", context={
        "messages": messages, "conversation": conv, "earlier": earlier,
        "images": services(request).store.images(conv.id),
        "versions": version_nav(services(request).store, messages)})


def refusal(request: HTMXRequest, exc: Exception, conv: Conversation | None,
            draft: str = "") -> Response[Any]:
    """Why an action was refused: a notice swapped into the page, or the page with it."""
    status = 400
    headers: dict[str, str] = {}
    if isinstance(exc, ChatError):
        status = exc.status_code
    elif isinstance(exc, LoadRefused):  # the sharing rules: 409 not loaded, 503 no room
        status = 409 if exc.kind == "not_loaded" else 503
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


async def refused(request: HTMXRequest, exc: Exception, conv: Conversation | None,
                  draft: str = "") -> Response[Any]:
    """refusal(), the conversation's replies rendered ahead where it shows the page."""
    if conv is not None and not request.htmx:
        await ahead(shown(services(request), conv)[0])
    return refusal(request, exc, conv, draft)


REFUSED = (ChatError, RequestError, QueueFull, EngineUnavailable, LoadRefused)


def http_error(request: HTMXRequest, exc: HTTPException) -> Response[Any]:
    """A 404 or 413 on a chat route: a notice in the page, never a JSON body in the chat."""
    detail = "the message and its pictures are too large" if exc.status_code == 413 \
        else str(exc.detail)
    return refusal(request, ChatError(detail, exc.status_code), None)


def go(request: HTMXRequest, url: str) -> Response[Any]:
    return ClientRedirect(url) if request.htmx else Redirect(url, status_code=303)

"""One chat request run for another API: routed, templated and submitted exactly as
/v1/chat/completions does it, then read whole or as a stream of chat deltas."""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from litestar import Request

from engine import FinalEvent, RequestHandle
from web.access.disclosure import final_error
from web.access.identity import current_user
from web.api.choices import ChatShape, usage_of
from web.api.completions import _known, token_texts
from web.api.errors import APIError
from web.api.fanout import cancel_all, collect_all, merge, submit_all
from web.api.params import route_model, sampling_params
from web.api.reasoning import with_chat_stops
from web.api.schemas import ChatChoice, ChatChunkChoice, ChatCompletionRequest, UsageInfo
from web.api.structured.chat_input import chat_input
from web.api.structured.shape import ToolChatShape, chat_choices
from web.api.vision import may_fetch
from web.services import Services, services
from web.sse import on_event


@dataclass
class ChatRun:
    """A submitted chat request: its services (the model it runs on), handle and shape."""

    s: Services
    handle: RequestHandle
    shape: ChatShape
    model: str

    @property
    def id(self) -> str:
        return self.handle.id


def failure(final: FinalEvent, request: Request[Any, Any, Any]) -> APIError:
    """A failed request's error (503 when its model could not be loaded), never a path for a
    normal user of a shared server."""
    message, unavailable = final_error(final, current_user(request))
    if unavailable:
        return APIError(message, 503, code="model_unavailable", type="server_error",
                        headers={"Retry-After": "5"})
    return APIError(message, 500, type="server_error")


async def start(request: Request[Any, Any, Any], body: ChatCompletionRequest,
                endpoint: str, names: Mapping[str, str] | None = None) -> ChatRun:
    """Route, template and submit `body` (one choice); the dashboard shows `endpoint`.
    `names`: the API's own name of a chat field (max_tokens -> max_output_tokens), so that
    a 400 names the field the client sent."""
    try:
        return await _start(request, body, endpoint)
    except APIError as exc:
        ours = exc.param
        if names and ours is not None and ours in names:
            exc.message = exc.detail = exc.message.replace(ours, names[ours], 1)
            exc.param = names[ours]
        raise


async def _start(request: Request[Any, Any, Any], body: ChatCompletionRequest,
                 endpoint: str) -> ChatRun:
    if body.n not in (None, 1):
        raise APIError("only one choice per request is supported here", param="n")
    s = services(request)
    async with route_model(s, body, current_user(request), _known(s)) as s:
        chat = await chat_input(body, s, may_fetch(s.config, current_user(request)))
        params = sampling_params(body, s.config, len(chat.ids), s.context_limit,
                                 s.config.default_max_tokens, body.max_tokens)
        params = dataclasses.replace(params, constraint=chat.constraint)
        handles = submit_all(request, s, chat.ids, with_chat_stops([params], s.tokenizer),
                             "messages", chat.reasoning, endpoint, chat.images)
        texts = token_texts(s.tokenizer)
        shape = ToolChatShape(None, texts, chat.tools, s.tokenizer) \
            if chat.tools is not None and chat.tools.parses else ChatShape(None, texts)
        return ChatRun(s, handles[0], shape, body.model or s.model_name)


async def finish(request: Request[Any, Any, Any], run: ChatRun
                 ) -> tuple[ChatChoice, UsageInfo]:
    """Run to the end (a client that goes away cancels it): the chat choice and usage."""
    finals = await collect_all(request, [run.handle], lambda f: failure(f, request))
    return run.shape.choice(0, run.handle, finals[0]), usage_of(finals)


async def deltas(request: Request[Any, Any, Any], run: ChatRun,
                 shutdown: anyio.Event | None = None
                 ) -> AsyncIterator[ChatChunkChoice | FinalEvent | APIError]:
    """The chat deltas as they come, then the FinalEvent (or the APIError of a failed
    request); leaving early (a disconnect closes the generator) cancels the request, and so
    does a server shutdown (the stream still ends with its last events)."""
    watcher = on_event(shutdown, lambda: cancel_all([run.handle])) if shutdown else None
    try:
        async for _, event in merge([run.handle]):
            if isinstance(event, FinalEvent) and event.finish_reason == "error":
                yield failure(event, request)
                return
            for choice in chat_choices(run.shape, 0, event):
                yield choice
            if isinstance(event, FinalEvent):
                yield event
    finally:
        if watcher is not None:
            watcher.cancel()
        cancel_all([run.handle])

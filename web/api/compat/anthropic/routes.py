"""POST /v1/messages (whole or streamed) and POST /v1/messages/count_tokens."""
from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, Router, post
from litestar.params import JSONBody
from litestar.types import ASGIApp

from web.access.identity import current_user
from web.api.compat.anthropic import stream, translate
from web.api.compat.anthropic.errors import anthropic_error_docs, anthropic_exception_handler
from web.api.compat.anthropic.schemas import MessagesRequest
from web.api.compat.run import finish, start
from web.api.completions import _known
from web.api.guards import json_depth_guard
from web.api.params import route_model
from web.api.structured.chat_input import chat_input
from web.api.vision import may_fetch
from web.services import services
from web.sse import event_stream

ENDPOINT = "/v1/messages"


class MessagesController(Controller):
    path = "/v1/messages"
    tags = ("Anthropic-compatible API",)

    @post("/", status_code=200, summary="Anthropic Messages (streaming or not)",
          description="With stream=true: text/event-stream of Anthropic's events.",
          responses=anthropic_error_docs(400, 404, 413, 429, 500, 503))
    async def messages(self, request: Request[Any, Any, Any],
                       data: JSONBody[MessagesRequest]) -> ASGIApp:
        body = translate.chat_request(data)
        run = await start(request, body, ENDPOINT)
        mid = f"msg_{run.id}"
        headers = {"X-Request-Id": run.id}
        if data.stream:
            # an ASGI app; sse-starlette types it with Starlette's ASGI types, not Litestar's
            return event_stream(lambda shutdown: stream.events(  # type: ignore[return-value]
                request, run, mid, data.stop_sequences, shutdown), headers)
        choice, usage = await finish(request, run)
        text = translate.output_text(run.s.tokenizer, run.handle.token_ids)
        reason = translate.stop_reason(choice.finish_reason, text, data.stop_sequences)
        return Response(translate.message(mid, run.model, choice, usage, reason),  # type: ignore[return-value]
                        headers=headers)

    @post("/count_tokens", status_code=200, summary="The prompt's token count (Anthropic)",
          responses=anthropic_error_docs(400, 404, 413, 503))
    async def count_tokens(self, request: Request[Any, Any, Any],
                           data: JSONBody[MessagesRequest]) -> dict[str, int]:
        body = translate.chat_request(data, count_only=True)
        s = services(request)
        async with route_model(s, body, current_user(request), _known(s)) as s:
            chat = await chat_input(body, s, may_fetch(s.config, current_user(request)))
            return {"input_tokens": len(chat.ids)}


anthropic_router = Router("/", route_handlers=[MessagesController],
                          exception_handlers={Exception: anthropic_exception_handler},
                          before_request=json_depth_guard)

"""POST /v1/responses (whole or streamed), stateless."""
from __future__ import annotations

import time
from typing import Any

from litestar import Controller, Request, Response, Router, post
from litestar.params import JSONBody
from litestar.types import ASGIApp

from web.api.compat.responses import stream, translate
from web.api.compat.responses.schemas import ResponsesRequest
from web.api.compat.run import finish, start
from web.api.errors import api_exception_handler, error_docs
from web.api.guards import json_depth_guard
from web.sse import event_stream

ENDPOINT = "/v1/responses"


class ResponsesController(Controller):
    path = "/v1/responses"
    tags = ("OpenAI-compatible API",)

    @post("/", status_code=200, summary="A response (streaming or not); nothing is stored",
          description="With stream=true: text/event-stream of the Responses events.",
          responses=error_docs(400, 404, 413, 429, 500, 503))
    async def create(self, request: Request[Any, Any, Any],
                     data: JSONBody[ResponsesRequest]) -> ASGIApp:
        run = await start(request, translate.chat_request(data), ENDPOINT, translate.NAMES)
        created, headers = int(time.time()), {"X-Request-Id": run.id}
        if data.stream:
            # an ASGI app; sse-starlette types it with Starlette's ASGI types, not Litestar's
            return event_stream(lambda shutdown: stream.events(  # type: ignore[return-value]
                request, run, data, created, shutdown), headers)
        choice, usage = await finish(request, run)
        body = translate.response(run.id, created, run.model, data,
                                  translate.output_items(run.id, choice),
                                  choice.finish_reason or "stop", usage)
        return Response(body, headers=headers)  # type: ignore[return-value]


responses_router = Router("/", route_handlers=[ResponsesController],
                          exception_handlers={Exception: api_exception_handler},
                          before_request=json_depth_guard)

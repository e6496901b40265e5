"""Ollama's /api/*: version, tags, ps, show, chat and generate (NDJSON streams unless
`stream: false`); pull, push, create, copy and delete are a clear 501."""
from __future__ import annotations

from typing import Any

from litestar import Controller, Litestar, Request, Response, Router, delete, get, post
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Reference, Schema
from litestar.params import JSONBody
from litestar.response import Stream
from litestar.types import ControllerRouterHandler

from engine import RequestError, parse_keep_alive
from web.access.identity import current_user
from web.api.compat.ollama import models, stream, translate
from web.api.compat.ollama.errors import ollama_error_docs, ollama_exception_handler
from web.api.compat.ollama.options import model_name
from web.api.compat.ollama.schemas import ChatRequest, GenerateRequest, ShowRequest
from web.api.compat.run import ChatRun, finish, start
from web.api.completions import _known
from web.api.errors import APIError
from web.api.guards import json_depth_guard
from web.api.params import ModelAsk, route_model
from web.services import services

VERSION = "0.12.0"  # the Ollama API version these routes follow
NDJSON = "application/x-ndjson"
# the chat path's fields as Ollama calls them
NAMES = {"max_tokens": "options.num_predict", "temperature": "options.temperature",
         "top_p": "options.top_p", "top_k": "options.top_k", "seed": "options.seed",
         "stop": "options.stop", "response_format": "format"}
UNSUPPORTED = ("pull", "push", "create", "copy")


def _stream(request: Request[Any, Any, Any], run: ChatRun, chat: bool) -> Stream:
    # Litestar's Stream stops reading on a disconnect: the generator closes, the request ends
    return Stream(stream.lines(request, run, chat), media_type=NDJSON,
                  headers={"X-Request-Id": run.id})


class OllamaController(Controller):
    path = "/api"
    tags = ("Ollama-compatible API",)

    @get("/version", summary="The Ollama API version served")
    async def version(self) -> dict[str, str]:
        return {"version": VERSION}

    @get("/tags", summary="The models served (the /v1/models ids, tagged :latest)")
    async def list_tags(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        return models.tags(services(request), current_user(request))

    @get("/ps", summary="The models loaded now")
    async def ps(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        return models.ps(services(request), current_user(request))

    @post("/show", status_code=200, summary="One model's details",
          responses=ollama_error_docs(400, 404, 413, 503))
    async def show(self, request: Request[Any, Any, Any],
                   data: JSONBody[ShowRequest]) -> dict[str, Any]:
        name = model_name(data.model or data.name)
        if not name:
            raise APIError("model is required", param="model")
        s = services(request)
        async with route_model(s, ModelAsk(name), current_user(request), _known(s)) as s:
            listed = next((m for m in models.listed(s, current_user(request)) if m.name == name),
                          models.listed(s, current_user(request))[0])
            return models.show(s, listed)

    @post("/chat", status_code=200, summary="Chat (NDJSON stream unless stream is false)",
          responses=ollama_error_docs(400, 404, 413, 429, 500, 503))
    async def chat(self, request: Request[Any, Any, Any],
                   data: JSONBody[ChatRequest]) -> Response[Any] | Stream:
        run = await start(request, translate.chat_request(data), "/api/chat", NAMES)
        if data.stream:
            return _stream(request, run, True)
        choice, _ = await finish(request, run)
        assert run.handle.final is not None
        return Response(translate.chat_reply(run.model, choice.message, run.handle.final),
                        headers={"X-Request-Id": run.id})

    @post("/generate", status_code=200,
          summary="Complete a prompt (NDJSON stream unless stream is false)",
          responses=ollama_error_docs(400, 404, 413, 429, 500, 503))
    async def generate(self, request: Request[Any, Any, Any],
                       data: JSONBody[GenerateRequest]) -> Response[Any] | Stream:
        body = translate.generate_request(data)
        if not data.prompt:  # Ollama's way to load (keep_alive 0: unload) a model
            s = services(request)
            async with route_model(s, body, current_user(request), _known(s)) as s:
                try:  # the same parsing as every route's keep_alive (route_model)
                    unload = data.keep_alive is not None and parse_keep_alive(data.keep_alive) == 0
                except RequestError as exc:
                    raise APIError(str(exc), param="keep_alive") from None
                return Response(translate.load_reply(body.model or s.model_name, unload))
        run = await start(request, body, "/api/generate", NAMES)
        if data.stream:
            return _stream(request, run, False)
        choice, _ = await finish(request, run)
        assert run.handle.final is not None
        return Response(translate.generate_reply(run.model, choice.message, run.handle.final),
                        headers={"X-Request-Id": run.id})

    @post(["/pull", "/push", "/create", "/copy", "/blobs/{digest:str}"], status_code=501,
          summary="Not served: Ferry serves the models it was started with",
          include_in_schema=False)  # not an operation of this server: only a clear 501
    async def manage(self) -> None:
        raise APIError("managing models is not supported by this server: it serves the "
                       "models it was started with (see /api/tags)", 501,
                       code="not_implemented", type="server_error")

    @delete("/delete", status_code=501, summary="Not served: Ferry does not delete models",
          include_in_schema=False)
    async def remove(self) -> None:
        raise APIError("deleting models is not supported by this server", 501,
                       code="not_implemented", type="server_error")


def document_ndjson_streams(app: Litestar) -> None:
    """The OpenAPI schema: chat and generate answer NDJSON too (their default), one JSON
    object a line."""
    paths = app.openapi_schema.paths or {}
    for path in ("/api/chat", "/api/generate"):
        item = paths.get(path)
        ok = (item.post.responses or {}).get("200") if item and item.post else None
        if ok is None or isinstance(ok, Reference):
            continue
        ok.content = {**(ok.content or {}), NDJSON: OpenAPIMediaType(
            schema=Schema(type=OpenAPIType.STRING, description="JSON objects, one a line; "
                          "the last has done: true"))}


def ollama_router(*extra: ControllerRouterHandler) -> Router:
    """The /api routes, with Ollama's error shape; `extra`: more of them (/api/embed's
    controller, from the embeddings module), under the same error handler and guard."""
    return Router("/", route_handlers=[OllamaController, *extra],
                  exception_handlers={Exception: ollama_exception_handler},
                  before_request=json_depth_guard)

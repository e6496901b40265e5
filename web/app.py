"""The Litestar app factory: routes, templates, static files, and the engine's lifespan."""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import jinja2
from litestar import Litestar, Router
from litestar.config.app import AppConfig
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware
from litestar.openapi.config import OpenAPIConfig
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin
from litestar.plugins.htmx import HTMXPlugin
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from engine import Tokenizer
from engine.host import settled_heap
from web.access.auth import Auth, AuthMiddleware, csrf_token
from web.access.hosts import HostGuard, HostPolicy
from web.api.compat.anthropic.routes import anthropic_router
from web.api.compat.ollama.routes import document_ndjson_streams, ollama_router
from web.api.compat.responses.routes import responses_router
from web.api.completions import OpenAIController
from web.api.controls import EngineController
from web.api.embeddings import EmbeddingsController, ollama_embed
from web.api.errors import api_exception_handler
from web.api.guards import json_depth_guard
from web.api.metrics import SystemController, make_registry
from web.api.requests import RequestsController
from web.api.schemas import ChatCompletionChunk, Completion, ErrorResponse
from web.config import WebConfig
from web.headers import SecurityHeaders
from web.pages.chat import ChatController
from web.pages.chat.replies import Replies
from web.pages.dashboard import DashboardController
from web.pages.login import login_router
from web.pages.rendered import markdown
from web.services import Services
from web.serving import ModelCatalog, Serving
from web.sse import EventDoc, document_event_streams
from web.storage.store import Store
from web.tracker import RequestTracker

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
REPO = HERE.parent
EVENT_STREAMS = {
    ("/v1/chat/completions", "post"): EventDoc(
        "With stream=true: one event per ChatCompletionChunk (an ErrorResponse if generation "
        "fails), then `[DONE]`.", (ChatCompletionChunk, ErrorResponse), ("[DONE]",)),
    ("/v1/completions", "post"): EventDoc(
        "With stream=true: one event per Completion chunk (an ErrorResponse if generation "
        "fails), then `[DONE]`.", (Completion, ErrorResponse), ("[DONE]",)),
    ("/v1/messages", "post"): EventDoc(
        "With stream=true: Anthropic's events (message_start, ping, content_block_start, "
        "content_block_delta, content_block_stop, message_delta, message_stop; error)."),
    ("/v1/responses", "post"): EventDoc(
        "With stream=true: the Responses events (response.created ... response.completed), "
        "each a JSON object with its type and sequence_number."),
    ("/dashboard/stream", "get"): EventDoc(
        "`event: board` with the dashboard's HTML, pushed when the engine state changes; "
        "comment pings keep it open."),
}


class FerryApp(Litestar):
    """Litestar without the plugins it adds for libraries that happen to be installed.
    Litestar loads its pydantic, attrs and OpenTelemetry plugins whenever those packages
    are importable (the API's client SDKs, which Ferry's tests use, install pydantic):
    ~250 modules, ~9 MB held for the server's life. Ferry's routes take and give msgspec
    structs and plain types only, and add no OpenTelemetry middleware."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        return [*plugins, MsgspecDIPlugin()]

    @staticmethod
    def _patch_opentelemetry_middleware(config: AppConfig) -> AppConfig:
        return config


def asset_files(config: WebConfig) -> list[Path]:
    """Folders holding htmx.min.js and sse.min.js (installed by `npm ci`, never a CDN): the
    checkout's node_modules, else the copy a pip-installed Ferry carries in its environment
    (<prefix>/share/ferry/node_modules, pyproject's data-files)."""
    root = config.assets_dir or REPO / "node_modules"
    installed = Path(sys.prefix) / "share" / "ferry" / "node_modules"
    if config.assets_dir is None and not root.is_dir() and installed.is_dir():
        root = installed
    dirs = [root / "htmx.org" / "dist", root / "htmx-ext-sse" / "dist"]
    for d in dirs:
        if not d.is_dir():
            log.warning("%s is missing: run `npm ci` (the pages need htmx)", d)
    return dirs


def templates_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.globals["markdown"] = markdown
    env.globals["ferry_csrf"] = csrf_token  # ferry_csrf(request): "" when none is needed
    return env


async def log_unexpected(exc: Exception, scope: Any) -> None:
    """Every error that is not an HTTP answer goes to the log (ferry.log) with its
    traceback, whichever route raised it; the client gets a plain 500."""
    if not isinstance(exc, HTTPException):
        log.error("unhandled error in %s %s", scope.get("method", ""), scope.get("path", ""),
                  exc_info=exc)


def create_app(engine: Serving, tokenizer: Tokenizer, config: WebConfig) -> Litestar:
    """The whole web app over `engine`: one Engine, a ModelSet (several models) or the gateway.
    Its lifespan starts `engine` (unless already running) and on
    shutdown cancels live replies (their text is saved), stops the engine, closes the store.

    Access goes through web.access.auth's middleware: local mode makes everyone the local admin
    (and refuses state changes started by other sites); shared mode needs a token or a
    session cookie plus CSRF token (see web/auth.py)."""
    env = templates_env()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        store = Store(config.db_path)
        tracker = RequestTracker()
        replies = Replies(store, config.save_interval, tracker)
        catalog = engine if isinstance(engine, ModelCatalog) else None  # several models
        app.state.replies = replies  # the chat's (web.pages.chat.replies.replies)
        app.state.services = Services(engine, tokenizer, config, store, tracker, env,
                                      time.time(), catalog)
        started_here = not engine.alive
        if started_here:
            engine.start()
        try:
            with settled_heap():  # what lives now lives as long as the server
                yield
        finally:
            await replies.shutdown()
            if started_here:
                await anyio.to_thread.run_sync(engine.stop)
            store.close()

    api = Router("/", route_handlers=[OpenAIController, RequestsController, EngineController,
                                     EmbeddingsController],
                 exception_handlers={Exception: api_exception_handler},
                 before_request=json_depth_guard)
    # the chat's forms carry pictures (and an import their exported copies): their own
    # body limit, each picture and message still checked by its own
    chat = Router("/", route_handlers=[ChatController],
                  request_max_body_size=config.chat_body_bytes)
    app = FerryApp(
        route_handlers=[
            chat, DashboardController, SystemController, api, login_router,
            anthropic_router, responses_router,
            ollama_router(ollama_embed),  # Ollama's error shape for /api/embed too
            create_static_files_router("/static", [HERE / "static"], name="static"),
            create_static_files_router("/assets", [*asset_files(config)], name="assets"),
        ],
        lifespan=[lifespan],
        # outermost first: headers on every answer, then the Host allow-list (before any
        # route, the API and SSE included), then who is asking. These middlewares type
        # their ASGI scope as a plain mapping, not litestar's TypedDicts.
        middleware=[DefineMiddleware(SecurityHeaders),  # type: ignore[arg-type]
                    DefineMiddleware(HostGuard,  # type: ignore[arg-type]
                                     policy=HostPolicy.build(config.shared,
                                                             config.allowed_hosts)),
                    DefineMiddleware(AuthMiddleware,  # type: ignore[arg-type]
                                     auth=Auth.from_config(config))],
        after_exception=[log_unexpected],
        # Ferry's own logging stays (app.logs: console and ferry.log); Litestar's default
        # config would replace the root logger's handlers and so drop the log file
        logging_config=None,
        plugins=[HTMXPlugin()],
        template_config=TemplateConfig(engine=JinjaTemplateEngine.from_environment(env)),
        openapi_config=OpenAPIConfig(title="Ferry", version="0.1.0",
                                     description="Local chat server: OpenAI-compatible API, "
                                     "request inspection and metrics."),
        request_max_body_size=config.max_body_bytes,
        on_startup=[lambda app: document_event_streams(app, EVENT_STREAMS),
                    document_ndjson_streams],
    )
    app.state.config = config
    app.state.metrics = make_registry(engine, config.model_name)
    return app

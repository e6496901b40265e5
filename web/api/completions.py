"""The OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/completions."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from jinja2 import TemplateError
from litestar import Controller, Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody
from litestar.types import ASGIApp
from sse_starlette import ServerSentEvent

from engine import FinalEvent, QueueFull, RequestError, RequestHandle, TextDelta
from web.access.identity import current_user
from web.api.errors import APIError, error_docs, from_engine
from web.api.params import check_chat, check_completion, check_model, sampling_params
from web.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    UsageInfo,
    encode,
)
from web.services import EngineUnavailable, Services, services
from web.sse import event_stream, on_event, until_disconnect

Chunk = Callable[[str | None, str | None, UsageInfo | None], Any]


def usage_info(final: FinalEvent) -> UsageInfo:
    u = final.usage
    return UsageInfo(u.prompt_tokens, u.completion_tokens, u.total_tokens,
                     PromptTokensDetails(u.cached_tokens))


def _error(final: FinalEvent) -> APIError:
    return APIError(final.error or "generation failed", 500, type="server_error")


async def collect(request: Request[Any, Any, Any], handle: RequestHandle) -> FinalEvent:
    """Run a request to the end; cancel it if the client goes away first."""
    final: FinalEvent | None = None
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            await until_disconnect(request)
            handle.cancel()
        tg.start_soon(watch)
        async for event in handle:
            if isinstance(event, FinalEvent):
                final = event
        tg.cancel_scope.cancel()
    assert final is not None
    if final.finish_reason == "error":
        raise _error(final)
    return final


async def stream(handle: RequestHandle, chunk: Chunk, include_usage: bool,
                 shutdown: anyio.Event, first: Any = None) -> AsyncIterator[ServerSentEvent]:
    """OpenAI stream chunks, `data: [DONE]` at the end; a disconnect cancels the request,
    and so does a server shutdown (the client still gets the last chunk and [DONE])."""
    watcher = on_event(shutdown, handle.cancel)
    try:
        if first is not None:
            yield ServerSentEvent(encode(first))
        async for event in handle:
            if isinstance(event, TextDelta):
                if event.text:
                    yield ServerSentEvent(encode(chunk(event.text, None, None)))
            elif event.finish_reason == "error":
                detail = ErrorDetail(event.error or "generation failed", "server_error")
                yield ServerSentEvent(encode(ErrorResponse(detail)))
            else:
                yield ServerSentEvent(encode(chunk(None, event.finish_reason, None)))
                if include_usage:
                    yield ServerSentEvent(encode(chunk(None, None, usage_info(event))))
        yield ServerSentEvent("[DONE]")
    finally:
        watcher.cancel()
        if handle.final is None:
            handle.cancel()


def _headers(handle: RequestHandle) -> dict[str, str]:
    return {"X-Request-Id": handle.id}


async def _submit(request: Request[Any, Any, Any], s: Services, prompt_ids: list[int],
                  body: Any, default_max: int, max_tokens: int | None) -> RequestHandle:
    params = sampling_params(body, s.config, len(prompt_ids), s.context_limit, default_max,
                             max_tokens)
    try:
        return s.submit(current_user(request), prompt_ids, params, "api")
    except (RequestError, QueueFull, EngineUnavailable) as exc:
        raise from_engine(exc, "messages" if hasattr(body, "messages") else "prompt") from exc


SSE_DOC = ("With `stream: true`: `text/event-stream`; every `data:` line holds one {} JSON "
           "object, and the stream ends with `data: [DONE]`.")


class OpenAIController(Controller):
    path = "/v1"
    tags = ("OpenAI-compatible API",)

    @get("/models", summary="The model this server serves")
    async def models(self, request: Request[Any, Any, Any]) -> ModelList:
        s = services(request)
        return ModelList([ModelCard(s.config.model_name, int(s.started), s.context_limit)])

    @post("/chat/completions", status_code=200, summary="Chat completion (streaming or not)",
          description=SSE_DOC.format("ChatCompletionChunk"),
          responses={200: ResponseSpec(ChatCompletion, description="The completion; with "
                                       "stream=true a text/event-stream of chunks"),
                     **error_docs(400, 404, 413, 429, 500, 503)})
    async def chat_completions(self, request: Request[Any, Any, Any],
                               data: JSONBody[ChatCompletionRequest]) -> ASGIApp:
        s = services(request)
        check_model(data, s.config.model_name)
        messages = check_chat(data, s.config)
        try:
            ids = await anyio.to_thread.run_sync(s.tokenizer.apply_chat_template, messages)
        except (TemplateError, ValueError) as exc:
            raise APIError(f"the chat template refused these messages: {exc}",
                           param="messages") from exc
        max_tokens = data.max_tokens if data.max_tokens is not None else \
            data.max_completion_tokens
        handle = await _submit(request, s, ids, data, s.config.default_max_tokens, max_tokens)
        cid, created, model = f"chatcmpl-{handle.id}", int(time.time()), data.model
        if data.stream:
            def chunk(text: str | None, finish: str | None, usage: UsageInfo | None) -> Any:
                choices = [] if usage else [ChatChunkChoice(0, ChatDelta(content=text), finish)]
                return ChatCompletionChunk(cid, created, model, choices, usage=usage)
            first = ChatCompletionChunk(cid, created, model,
                                        [ChatChunkChoice(0, ChatDelta("assistant", ""))])
            include = bool(data.stream_options and data.stream_options.include_usage)
            return event_stream(lambda shutdown: stream(handle, chunk, include, shutdown, first),
                                _headers(handle))
        final = await collect(request, handle)
        body = ChatCompletion(cid, created, model,
                              [ChatChoice(0, AssistantMessage("assistant", handle.text),
                                          final.finish_reason)], usage_info(final))
        return Response(body, headers=_headers(handle))  # type: ignore[return-value]

    @post("/completions", status_code=200, summary="Text completion (streaming or not)",
          description=SSE_DOC.format("Completion"),
          responses={200: ResponseSpec(Completion, description="The completion; with "
                                       "stream=true a text/event-stream of chunks"),
                     **error_docs(400, 404, 413, 429, 500, 503)})
    async def completions(self, request: Request[Any, Any, Any],
                          data: JSONBody[CompletionRequest]) -> ASGIApp:
        s = services(request)
        check_model(data, s.config.model_name)
        ids = await anyio.to_thread.run_sync(check_completion, data, s.tokenizer)
        handle = await _submit(request, s, ids, data, 16, data.max_tokens)
        cid, created, model = f"cmpl-{handle.id}", int(time.time()), data.model
        if data.stream:
            def chunk(text: str | None, finish: str | None, usage: UsageInfo | None) -> Any:
                choices = [] if usage else [CompletionChoice(0, text or "", finish)]
                return Completion(cid, created, model, choices, usage=usage)
            include = bool(data.stream_options and data.stream_options.include_usage)
            return event_stream(lambda shutdown: stream(handle, chunk, include, shutdown),
                                _headers(handle))
        final = await collect(request, handle)
        body = Completion(cid, created, model,
                          [CompletionChoice(0, handle.text, final.finish_reason)],
                          usage=usage_info(final))
        return Response(body, headers=_headers(handle))  # type: ignore[return-value]

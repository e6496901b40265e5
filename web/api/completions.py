"""The OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/completions."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from functools import lru_cache
from typing import Any, Literal

import anyio
import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody
from litestar.types import ASGIApp
from sse_starlette import EventSourceResponse, ServerSentEvent

from engine import (
    Constraint,
    FinalEvent,
    ImageInput,
    Reasoning,
    RequestHandle,
    TextDelta,
    Tokenizer,
)
from web.access.disclosure import final_error, model_info
from web.access.identity import User, current_user
from web.api.choices import ChatShape, CompletionShape, usage_of
from web.api.embeddings import refuse_embedding_model
from web.api.errors import APIError, error_docs
from web.api.fanout import cancel_all, collect_all, merge, submit_all
from web.api.logprobs import TokenTexts
from web.api.params import check_completion, route_model, sampling_params
from web.api.reasoning import with_chat_stops
from web.api.schemas import (
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
    ModelCard,
    ModelList,
    UsageInfo,
    encode,
)
from web.api.structured.chat_input import chat_input, constraint_of, passthrough, upstream
from web.api.structured.shape import ToolChatShape, chat_choices
from web.api.vision import may_fetch
from web.services import Services, services
from web.sse import event_stream, on_event
from web.worker import below_engine

# the `object` fields of stream chunks and completions
CHUNK: Literal["chat.completion.chunk"] = "chat.completion.chunk"
TEXT: Literal["text_completion"] = "text_completion"
# (choice index, event) -> the chunks to send; index -1 with a UsageInfo: the usage chunk
Render = Callable[[int, Any], list[Any]]


def _failure(final: FinalEvent, user: User) -> APIError:
    """A failed choice's answer: 503 naming the model when it could not be loaded (a file
    gone, say), else 500; for a normal user of a shared server, never a path."""
    message, unavailable = final_error(final, user)
    if unavailable:
        return APIError(message, 503, code="model_unavailable", type="server_error",
                        headers={"Retry-After": "5"})
    return APIError(message, 500, type="server_error")


def _on_error(request: Request[Any, Any, Any]) -> Callable[[FinalEvent], APIError]:
    user = current_user(request)
    return lambda final: _failure(final, user)


@lru_cache(maxsize=4)
def token_texts(tokenizer: Tokenizer) -> TokenTexts:
    return TokenTexts(tokenizer)


async def stream(handles: list[RequestHandle], render: Render, include_usage: bool,
                 shutdown: anyio.Event, first: list[Any],
                 on_error: Callable[[FinalEvent], APIError]) -> AsyncIterator[ServerSentEvent]:
    """OpenAI stream chunks of every choice, `data: [DONE]` at the end; a disconnect cancels
    every choice's request, and so does a server shutdown (the client still gets the last
    chunks and [DONE])."""
    watcher = on_event(shutdown, lambda: cancel_all(handles))
    finals: list[FinalEvent] = []
    try:
        for chunk in first:
            yield ServerSentEvent(encode(chunk))
        async for index, event in merge(handles):
            if isinstance(event, FinalEvent) and event.finish_reason == "error":
                failed = on_error(event)
                detail = ErrorDetail(failed.message, failed.type, code=failed.code)
                yield ServerSentEvent(encode(ErrorResponse(detail)))
                continue
            if isinstance(event, FinalEvent):
                finals.append(event)
            for chunk in render(index, event):
                yield ServerSentEvent(encode(chunk))
        if include_usage and finals:
            yield ServerSentEvent(encode(render(-1, usage_of(finals))[0]))
        yield ServerSentEvent("[DONE]")
    finally:
        watcher.cancel()
        cancel_all(handles)


def _headers(handles: list[RequestHandle]) -> dict[str, str]:
    return {"X-Request-Id": handles[0].id}


def _submit(request: Request[Any, Any, Any], s: Services, prompt_ids: list[int],
            body: Any, default_max: int, max_tokens: int | None,
            constraint: Constraint | None = None, reasoning: Reasoning | None = None,
            images: tuple[ImageInput, ...] = ()) -> list[RequestHandle]:
    n = body.n or 1
    params = [dataclasses.replace(sampling_params(body, s.config, len(prompt_ids),
                                                  s.context_limit, default_max, max_tokens, i),
                                  constraint=constraint) for i in range(n)]
    chat = hasattr(body, "messages")
    return submit_all(request, s, prompt_ids, with_chat_stops(params, s.tokenizer) if chat
                      else params, "messages" if chat else "prompt", reasoning, images=images)


def _prompt_text(body: CompletionRequest, ids: list[int], tokenizer: Tokenizer) -> str:
    """What echo shows: the prompt as sent when it was text, else its ids decoded."""
    prompt: Any = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    return tokenizer.decode(ids, skip_special_tokens=False)


SSE_DOC = ("With `stream: true`: `text/event-stream`; every `data:` line holds one {} JSON "
           "object, and the stream ends with `data: [DONE]`.")


def _route_docs(body: type, chunk: str) -> dict[str, Any]:
    """The OpenAPI description and responses of a completion route (streaming or not)."""
    # generate_examples off, as on every ResponseSpec: inventing examples would import
    # polyfactory and Faker, which stay for the process's life, for the schema only
    return {"description": SSE_DOC.format(chunk),
            "responses": {200: ResponseSpec(body, description="The completion; with "
                                            "stream=true a text/event-stream of chunks",
                                            generate_examples=False),
                          **error_docs(400, 404, 409, 413, 429, 500, 503)}}


def _event_stream(request: Request[Any, Any, Any],
                  data: ChatCompletionRequest | CompletionRequest,
                  handles: list[RequestHandle], render: Render,
                  first: list[Any]) -> EventSourceResponse:
    """The SSE answer of a stream=true completion (usage at the end if the client asked)."""
    include = bool(data.stream_options and data.stream_options.include_usage)
    on_error = _on_error(request)
    return event_stream(lambda shutdown: stream(handles, render, include, shutdown, first,
                                                on_error), _headers(handles))


def _served(s: Services) -> tuple[Any, ...]:
    """Upstream mode: the union of the upstreams' models (web/gateway's ServedModel, each with
    the upstreams that serve it); else, or before any upstream answered, ()."""
    served = getattr(s.engine, "served_models", None)
    return tuple(served()) if served is not None else ()


def _known(s: Services) -> list[str]:
    return [m.id for m in _served(s)]


def _task(s: Services) -> str:
    """The card's word for what the model does: generate, embed or rerank."""
    task = str(getattr(s.engine, "task", None) or "generate")
    return "rerank" if task == "score" else task


def _memory(engine: Any) -> dict[str, int] | None:
    """One engine's resident bytes by part (None where it cannot tell: a gateway)."""
    measure = getattr(engine, "footprint", None)
    parts = measure() if callable(measure) else None
    return parts.as_dict() if parts is not None else None


class OpenAIController(Controller):
    path = "/v1"
    tags = ("OpenAI-compatible API",)

    def _card(self, s: Services, served: Any = None) -> ModelCard:
        thinks = bool(getattr(s.tokenizer, "thinks", False))  # the gateway: the upstream's
        runs = s.config.model_runs or None
        task = _task(s)
        return ModelCard(served.id if served else s.config.model_name, int(s.started),
                         (served and served.max_context) or s.context_limit,
                         chat_template=getattr(s.tokenizer, "chat_template_name", None),
                         architecture=runs.split(":", 1)[0] if runs else None, runs=runs,
                         reasoning=thinks, embedding=task == "embed", task=task,
                         vision=bool(getattr(s.engine, "takes_images", False)),
                         upstreams=list(served.upstreams) if served else None,
                         memory=None if served else _memory(s.engine))

    def _cards(self, s: Services, user: User) -> list[ModelCard]:
        """Every model served; with several, each says whether it is loaded, and its size
        (a normal user of a shared server: no path in it)."""
        served = _served(s)
        if served:  # upstream mode: the union of the upstreams' models
            return [self._card(s, m) for m in served]
        if s.catalog is None:
            return [self._card(s)]
        cards = []
        for m in (model_info(m, user) for m in s.catalog.models()):
            runs = m.runs or str(m.details.get("runs") or "") or None
            one = dataclasses.replace(s, engine=s.catalog.serving(m.name))
            task = _task(one)
            card = self._card(s) if m.default else ModelCard(
                m.name, int(s.started), one.context_limit,
                architecture=runs.split(":", 1)[0] if runs else None, runs=runs,
                embedding=task == "embed", task=task,
                vision=bool(getattr(one.engine, "takes_images", False)))
            cards.append(msgspec.structs.replace(card, runs=runs, loaded=m.loaded, state=m.state,
                                                 default=m.default, size=m.size,
                                                 memory=dict(m.memory) if m.memory else None,
                                                 keep_alive=m.keep_alive, error=m.error,
                                                 source=str(m.details.get("source")
                                                            or "configured")))
        return cards

    @get("/models", summary="The models this server serves (loaded or not)")
    async def models(self, request: Request[Any, Any, Any]) -> ModelList:
        return ModelList(self._cards(services(request), current_user(request)))

    @get("/models/{model_id:path}", summary="One model, by id",
         responses=error_docs(404))
    async def model(self, request: Request[Any, Any, Any], model_id: str) -> ModelCard:
        s = services(request)
        model_id = model_id.lstrip("/")
        cards = self._cards(s, current_user(request))
        for card in cards:
            if card.id == model_id:
                return card
        known = ", ".join(repr(c.id) for c in cards)
        raise APIError(f"the model {model_id!r} does not exist; this server serves {known}",
                       404, param="model", code="model_not_found")

    @post("/chat/completions", status_code=200, summary="Chat completion (streaming or not)",
          **_route_docs(ChatCompletion, "ChatCompletionChunk"))
    async def chat_completions(self, request: Request[Any, Any, Any],
                               data: JSONBody[ChatCompletionRequest]) -> ASGIApp:
        s = services(request)
        async with route_model(s, data, current_user(request), _known(s)) as routed:
            refuse_embedding_model(routed)
            return await self._chat(request, routed, data)

    async def _chat(self, request: Request[Any, Any, Any], s: Services,
                    data: ChatCompletionRequest) -> ASGIApp:
        chat = await chat_input(data, s, may_fetch(s.config, current_user(request)))
        ids = chat.ids
        max_tokens = data.max_tokens if data.max_tokens is not None else \
            data.max_completion_tokens
        handles = _submit(request, s, ids, data, s.config.default_max_tokens, max_tokens,
                          chat.constraint, chat.reasoning, chat.images)
        top = (data.top_logprobs or 0) if data.logprobs else None
        shape = ToolChatShape(top, token_texts(s.tokenizer), chat.tools, s.tokenizer) \
            if chat.tools is not None and chat.tools.parses else \
            ChatShape(top, token_texts(s.tokenizer))
        cid, created = f"chatcmpl-{handles[0].id}", int(time.time())
        model = data.model or s.model_name
        if data.stream:
            def render(index: int, event: Any) -> list[Any]:
                if isinstance(event, UsageInfo):
                    return [ChatCompletionChunk(cid, created, model, [], CHUNK, event)]
                return [ChatCompletionChunk(cid, created, model, [choice], CHUNK)
                        for choice in chat_choices(shape, index, event)]
            first = [ChatCompletionChunk(cid, created, model,
                                         [ChatChunkChoice(i, ChatDelta("assistant", ""))], CHUNK)
                     for i in range(len(handles))]
            # an ASGI app; sse-starlette types it with Starlette's ASGI types, not Litestar's
            return _event_stream(request, data, handles, render, first)  # type: ignore[return-value]
        finals = await collect_all(request, handles, _on_error(request))
        body = ChatCompletion(cid, created, model,
                              [shape.choice(i, h, f) for i, (h, f) in
                               enumerate(zip(handles, finals))], usage_of(finals))
        return Response(body, headers=_headers(handles))  # type: ignore[return-value]

    @post("/completions", status_code=200, summary="Text completion (streaming or not)",
          **_route_docs(Completion, "Completion"))
    async def completions(self, request: Request[Any, Any, Any],
                          data: JSONBody[CompletionRequest]) -> ASGIApp:
        s = services(request)
        async with route_model(s, data, current_user(request), _known(s)) as routed:
            refuse_embedding_model(routed)
            return await self._complete(request, routed, data)

    async def _complete(self, request: Request[Any, Any, Any], s: Services,
                        data: CompletionRequest) -> ASGIApp:
        ids = await below_engine(check_completion, data, s.tokenizer)
        constraint = await constraint_of(data, s)
        if upstream(s):
            ids.extra = passthrough(data)  # type: ignore[attr-defined]
        handles = _submit(request, s, ids, data, 16, data.max_tokens, constraint)
        shape = CompletionShape(ids, _prompt_text(data, ids, s.tokenizer) if data.echo else "",
                                data.echo, data.logprobs, token_texts(s.tokenizer))
        cid, created, model = f"cmpl-{handles[0].id}", int(time.time()), data.model or s.model_name
        if data.stream:
            def render(index: int, event: Any) -> list[Any]:
                if isinstance(event, UsageInfo):
                    return [Completion(cid, created, model, [], TEXT, event)]
                if isinstance(event, FinalEvent):
                    choices = [shape.end(index, event)]
                else:
                    assert isinstance(event, TextDelta)
                    choices = shape.deltas(index, event)
                return [Completion(cid, created, model, [c], TEXT) for c in choices]
            first = [Completion(cid, created, model, [c], TEXT) for i in range(len(handles))
                     if (c := shape.echo_first(i)) is not None]
            # an ASGI app; sse-starlette types it with Starlette's ASGI types, not Litestar's
            return _event_stream(request, data, handles, render, first)  # type: ignore[return-value]
        finals = await collect_all(request, handles, _on_error(request))
        body = Completion(cid, created, model,
                          [shape.choice(i, h, f) for i, (h, f) in
                           enumerate(zip(handles, finals))], TEXT, usage_of(finals))
        return Response(body, headers=_headers(handles))  # type: ignore[return-value]

"""Embedding requests through the engine: one engine request per input (queued, budgeted,
shown on the dashboard as "embedding", batched across callers), their vectors collected."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from litestar import Request

from engine import QueueFull, RequestError, SamplingParams
from web.access.disclosure import final_error
from web.access.identity import User, current_user
from web.api.errors import APIError, from_engine
from web.api.fanout import cancel_all, collect_all
from web.api.params import ModelAsk, route_model
from web.services import EngineUnavailable, Services

EMBED = SamplingParams(max_tokens=0, embed=True)


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: list[list[float]]
    prompt_tokens: int
    request_id: str  # the first input's engine request (the X-Request-Id answered)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Request-Id": self.request_id}


def task_of(s: Services) -> str | None:
    """"embed" or "generate" where the serving engine says (a model of a set: once loaded)."""
    task = getattr(s.engine, "task", None)
    return str(task) if task is not None else None


def model_limit(s: Services) -> tuple[int, int]:
    """(most tokens an input may have, vocabulary size) of the routed model."""
    executor = getattr(s.engine, "executor", None)
    vocab = int(getattr(executor, "vocab_size", 0) or s.tokenizer.vocab_size)
    return s.context_limit, vocab


@asynccontextmanager
async def route(s: Services, model: str | None, keep_alive: object, user: User,
                rerank: bool = False) -> AsyncIterator[Services]:
    """The services of the model named (missing: the default), routed as a completion is
    (404 when not served, the shared-model rules); 400 naming it when it makes no
    embeddings (`rerank`: nor relevance scores)."""
    async with route_model(s, ModelAsk(model, keep_alive), user) as routed:
        task = task_of(routed)
        if task == "score" and not rerank:
            raise APIError(f"the model {routed.model_name!r} is a reranker (a cross-encoder); "
                           "it makes no embeddings (use /v1/rerank)", param="model",
                           code="model_not_embedding")
        if task not in (None, "embed", "score"):
            raise not_embedding(routed.model_name)
        yield routed


def refuse_embedding_model(s: Services) -> None:
    """A 400 naming the model when a chat or completion request reaches an embedding model."""
    if task_of(s) in ("embed", "score"):
        raise APIError(f"the model {s.model_name!r} is an embedding model; it generates no "
                       "text (use /v1/embeddings or /v1/rerank)", param="model",
                       code="model_is_embedding")


def not_embedding(name: str) -> APIError:
    return APIError(f"the model {name!r} is a chat model; it makes no embeddings (serve an "
                    "embedding model, e.g. a sentence-transformers folder)", param="model",
                    code="model_not_embedding")


async def embed(request: Request[Any, Any, Any], s: Services,
                inputs: list[list[int]]) -> Embedded:
    """Every input's vector, in order. Inputs go in at most per_user_limit at a time in
    shared mode, so a long list waits its turns instead of failing."""
    user = current_user(request)
    limit = s.config.per_user_limit if s.config.shared else None
    wave = max(1, limit or len(inputs))
    vectors: list[list[float]] = []
    first_id = ""
    for first in range(0, len(inputs), wave):
        handles = []
        try:
            for ids in inputs[first:first + wave]:
                # the dashboard's label for the row (it shows no text of an input)
                handles.append(s.submit(user, ids, EMBED, "embedding", label="embedding",
                                        endpoint=request.url.path))
                first_id = first_id or handles[-1].id
        except (RequestError, QueueFull, EngineUnavailable) as exc:
            cancel_all(handles)
            if isinstance(exc, RequestError) and "embeddings" in str(exc):
                raise not_embedding(s.model_name) from None
            raise from_engine(exc, "input") from exc
        finals = await collect_all(request, handles, lambda f: failure(f, user))
        vectors.extend(list(f.extra["embedding"]) for f in finals)  # type: ignore[call-overload]
    return Embedded(vectors, sum(len(ids) for ids in inputs), first_id)


def failure(final: Any, user: Any) -> APIError:
    message, unavailable = final_error(final, user)
    if unavailable:
        return APIError(message, 503, code="model_unavailable", type="server_error",
                        headers={"Retry-After": "5"})
    return APIError(message, 500, type="server_error")

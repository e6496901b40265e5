"""Ollama's /api/embed: a route handler of its own, registered beside the rest of Ollama's
API. Errors are Ollama's shape: {"error": "..."}."""
from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from web.access.identity import current_user
from web.api.embeddings.inputs import token_lists
from web.api.embeddings.run import embed, model_limit, route
from web.api.embeddings.schemas import OllamaEmbedRequest, OllamaEmbedResponse, OllamaError
from web.api.embeddings.vectors import check_dimensions, cut
from web.services import services

ERRORS = {400: "Invalid input, or not an embedding model", 404: "Unknown model",
          413: "Request body too large", 429: "Queue full", 500: "Embedding failed",
          503: "The engine is not running"}


@post("/api/embed", status_code=200, tags=["Ollama-compatible API"],
      summary="Embeddings of one or several inputs (Ollama)",
      responses={code: ResponseSpec(OllamaError, description=text, generate_examples=False)
                 for code, text in ERRORS.items()})
async def ollama_embed(request: Request[Any, Any, Any],
                       data: JSONBody[OllamaEmbedRequest]) -> Response[OllamaEmbedResponse]:
    started = time.perf_counter_ns()
    # Ollama's clients write "name:tag"; a bare name means ":latest"
    name = data.model.removesuffix(":latest")
    async with route(services(request), name, data.keep_alive,
                   current_user(request)) as s:
        limit, vocab = model_limit(s)
        inputs = token_lists(data.input, s.tokenizer, vocab, limit,
                             truncate=data.truncate is not False)
        executor = getattr(s.engine, "executor", None)
        dims = check_dimensions(data.dimensions, int(getattr(executor, "dimensions", 0) or 0),
                                tuple(getattr(executor, "matryoshka_dims", ())))
        done = await embed(request, s, inputs)
        vectors = done.vectors if dims is None else [cut(v, dims) for v in done.vectors]
        return Response(OllamaEmbedResponse(data.model, vectors,
                                            time.perf_counter_ns() - started, 0,
                                            done.prompt_tokens), headers=done.headers)

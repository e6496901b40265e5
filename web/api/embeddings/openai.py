"""OpenAI's /v1/embeddings, and /v1/rerank (Jina and Cohere's shape, as llama.cpp and vLLM
take it): with no cross-encoder served, documents are ranked by the cosine similarity of
their embeddings with the query's."""
from __future__ import annotations

import base64
import struct
import time
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from engine import Tokenizer
from web.access.identity import current_user
from web.api.embeddings.inputs import token_lists
from web.api.embeddings.run import embed, model_limit, route, task_of
from web.api.embeddings.schemas import (
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
    RerankDocument,
    RerankList,
    RerankRequest,
    RerankResult,
)
from web.api.embeddings.vectors import check_dimensions, cosine, cut
from web.api.errors import APIError, error_docs
from web.services import services
from web.worker import below_engine


def as_base64(vector: list[float]) -> str:
    """OpenAI's base64 form: the float32 values, little-endian, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def pair_ids(tokenizer: Tokenizer, query: str, document: str, limit: int,
             index: int) -> list[int]:
    """[CLS] query [SEP] document [SEP], the document cut to fit the context (as
    sentence-transformers' CrossEncoder does); a 400 when the query alone does not fit."""
    if not document:
        raise APIError(f"documents[{index}] is an empty string", param="documents")
    ids = tokenizer.encode_pair_truncated(query, document, limit)
    if len(ids) > limit:
        raise APIError(f"the query is too long to rank documents with: {len(ids)} tokens with "
                       f"the document, the model takes at most {limit}", param="query")
    return ids


def prompted_pair_ids(tokenizer: Tokenizer, template: str, query: str, document: str,
                      limit: int, index: int) -> list[int]:
    """A decoder reranker's prompt for the pair (its template with {query} and {document}),
    the document cut by tokens to fit the context; a 400 when the query alone does not."""
    if not document:
        raise APIError(f"documents[{index}] is an empty string", param="documents")
    before, after = template.split("{document}", 1)
    head, tail = before.replace("{query}", query), after.replace("{query}", query)
    ids = tokenizer.encode(head + document + tail, add_special_tokens=False)
    doc = tokenizer.encode(document, add_special_tokens=False)
    for _ in range(4):  # a cut may re-tokenize at its edge: a few tokens more each time
        over = len(ids) - limit
        if over <= 0:
            return ids
        if over >= len(doc):
            raise APIError(f"the query is too long to rank documents with: the model takes at "
                           f"most {limit} tokens with the reranker's prompt", param="query")
        doc = doc[:len(doc) - over]
        ids = tokenizer.encode(head + tokenizer.decode(doc) + tail, add_special_tokens=False)
    raise APIError(f"documents[{index}] could not be cut to the model's {limit} tokens",
                   param="documents")


class EmbeddingsController(Controller):
    path = "/v1"
    tags = ("OpenAI-compatible API",)

    @post("/embeddings", status_code=200, summary="Embeddings of one or several inputs",
          responses=error_docs(400, 404, 413, 429, 500, 503))
    async def embeddings(self, request: Request[Any, Any, Any],
                         data: JSONBody[EmbeddingRequest]) -> Response[EmbeddingList]:
        async with route(services(request), data.model, data.keep_alive,
                       current_user(request)) as s:
            limit, vocab = model_limit(s)
            executor = getattr(s.engine, "executor", None)
            inputs = token_lists(data.input, s.tokenizer, vocab, limit)
            width = int(getattr(executor, "dimensions", 0) or 0)
            dims = check_dimensions(data.dimensions, width,
                                  tuple(getattr(executor, "matryoshka_dims", ())))
            done = await embed(request, s, inputs)
            data_out = []
            for i, vector in enumerate(done.vectors):
                if dims is not None:
                    vector = cut(vector, dims)
                data_out.append(Embedding(i, as_base64(vector) if data.encoding_format == "base64"
                                          else vector))
            usage = EmbeddingUsage(done.prompt_tokens, done.prompt_tokens)
            return Response(EmbeddingList(data_out, data.model or s.model_name, usage),
                            headers=done.headers)

    @post("/rerank", status_code=200, summary="Documents ranked by relevance to a query",
          responses=error_docs(400, 404, 413, 429, 500, 503))
    async def rerank(self, request: Request[Any, Any, Any],
                     data: JSONBody[RerankRequest]) -> Response[RerankList]:
        async with route(services(request), data.model, data.keep_alive,
                       current_user(request), rerank=True) as s:
            if not data.query:
                raise APIError("query must not be empty", param="query")
            if not data.documents:
                raise APIError("documents must not be empty", param="documents")
            if data.top_n is not None and data.top_n < 1:
                raise APIError(f"top_n must be a positive integer, got {data.top_n}", param="top_n")
            limit, vocab = model_limit(s)
            if task_of(s) == "score":  # a cross-encoder: each (query, document) pair scored
                template = getattr(getattr(s.engine, "executor", None), "rerank_template", None)

                def tokenized() -> list[list[int]]:  # many long documents take a while
                    return [prompted_pair_ids(s.tokenizer, template, data.query, doc, limit, i)
                            if template else pair_ids(s.tokenizer, data.query, doc, limit, i)
                            for i, doc in enumerate(data.documents)]

                done = await embed(request, s, await below_engine(tokenized))
                scores = [v[0] for v in done.vectors]
            else:  # an embedding model: cosine of the query's and each document's vector
                query = token_lists(data.query, s.tokenizer, vocab, limit, field="query")
                docs = token_lists(data.documents, s.tokenizer, vocab, limit, field="documents")
                done = await embed(request, s, query + docs)
                scores = [cosine(done.vectors[0], d) for d in done.vectors[1:]]
            scored = sorted(((x, i) for i, x in enumerate(scores)), key=lambda t: -t[0])
            results = [RerankResult(i, score, RerankDocument(data.documents[i])
                                    if data.return_documents else None)
                       for score, i in scored[:data.top_n or len(scored)]]
            usage = EmbeddingUsage(done.prompt_tokens, done.prompt_tokens)
            return Response(RerankList(f"rerank-{int(time.time() * 1000)}",
                                       data.model or s.model_name, results, usage),
                            headers=done.headers)

"""Request and response bodies of the embedding APIs."""
from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

# OpenAI's `input`: one text, several, one token-id list, or several (msgspec takes one list
# type in a union: the items are checked by inputs.token_lists)
Input = str | list[Any]


class EmbeddingRequest(Struct, kw_only=True):
    input: Input
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    keep_alive: str | int | float | None = None  # several models: how long it stays loaded


class Embedding(Struct):
    index: int
    embedding: list[float] | str  # floats, or base64 of little-endian float32s
    object: str = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class RerankRequest(Struct, kw_only=True):
    query: str
    documents: list[str]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False
    keep_alive: str | int | float | None = None


class RerankDocument(Struct):
    text: str


class RerankResult(Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankList(Struct):
    id: str
    model: str
    results: list[RerankResult]
    usage: EmbeddingUsage
    object: str = "list"


class OllamaEmbedRequest(Struct, kw_only=True):
    model: str
    input: str | list[str]
    truncate: bool | None = None  # None: True, as Ollama takes it
    keep_alive: str | int | float | None = None
    options: dict[str, object] | None = None
    dimensions: int | None = None


class OllamaEmbedResponse(Struct):
    model: str
    embeddings: list[list[float]]
    total_duration: int  # nanoseconds, as Ollama counts
    load_duration: int
    prompt_eval_count: int


class OllamaError(Struct):
    error: str

"""Ollama's error shape: {"error": "..."}, the message naming the field."""
from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from msgspec import Struct

from web.api.errors import api_exception_handler
from web.api.schemas import ErrorResponse


class OllamaError(Struct):
    error: str


def ollama_error_docs(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers of an Ollama route."""
    return {c: ResponseSpec(OllamaError, description="the error, naming the field",
                            generate_examples=False) for c in codes}


def ollama_error(message: str, param: str | None = None) -> dict[str, str]:
    if param and param not in message:
        message = f"{param}: {message}"
    return {"error": message}


def ollama_exception_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The OpenAI-shaped answer the rest of the API gives, reshaped (same status, headers)."""
    answer = api_exception_handler(request, exc)
    body = answer.content
    content = ollama_error(body.error.message, body.error.param) \
        if isinstance(body, ErrorResponse) else {"error": str(body)}
    return Response(content, status_code=answer.status_code or 500,
                    headers=dict(answer.headers))

"""Anthropic's error shape: {"type": "error", "error": {"type": ..., "message": ...}}, the
message naming the field (`messages.0.content.1.type: ...`)."""
from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec
from msgspec import Struct

from web.api.errors import api_exception_handler
from web.api.schemas import ErrorResponse

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
         503: "overloaded_error"}


class AnthropicErrorDetail(Struct):
    type: str
    message: str


class AnthropicError(Struct):
    error: AnthropicErrorDetail
    type: str = "error"


def anthropic_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    if param and not message.startswith(param):
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": TYPES.get(status, "api_error"),
                                       "message": message}}


def anthropic_error_docs(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers of an Anthropic route."""
    return {c: ResponseSpec(AnthropicError, description=TYPES.get(c, "api_error"),
                            generate_examples=False) for c in codes}


def anthropic_exception_handler(request: Request[Any, Any, Any],
                                exc: Exception) -> Response[Any]:
    """The OpenAI-shaped answer the rest of the API gives, reshaped (same status, headers)."""
    answer = api_exception_handler(request, exc)
    body, status = answer.content, answer.status_code or 500
    if isinstance(body, ErrorResponse):
        content = anthropic_error(status, body.error.message, body.error.param)
    else:
        content = anthropic_error(status, str(msgspec.to_builtins(body)))
    return Response(content, status_code=status, headers=dict(answer.headers))

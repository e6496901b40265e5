"""OpenAI-style errors for the /v1 API: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec

from engine import LoadRefused, QueueFull, RequestError
from web.api.schemas import ErrorDetail, ErrorResponse
from web.services import EngineUnavailable

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 409: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error"}
# a normal user's request the sharing rules keep from loading its model (shared mode)
LOAD_REFUSED = {"not_loaded": (409, "model_not_loaded"), "no_room": (503, "model_no_room")}


def error_docs(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers a /v1 handler gives (all OpenAI-style)."""
    text = {400: "Invalid or unsupported request", 403: "Only an admin can do this",
            404: "Unknown model or request",
            409: "The model is not loaded, and only an admin loads models here",
            413: "Request body too large", 429: "Queue full; retry after Retry-After seconds",
            500: "Generation failed",
            503: "The engine is not running, or the model's load would need the default "
                 "model's memory"}
    return {c: ResponseSpec(ErrorResponse, description=text[c], generate_examples=False)
            for c in codes}


class APIError(HTTPException):
    def __init__(self, message: str, status_code: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail=message, status_code=status_code, headers=headers)
        self.message = message
        self.param = param
        self.code = code
        self.type = type or TYPES.get(status_code, "server_error")


def unsupported(param: str, what: str | None = None) -> APIError:
    return APIError(f"{what or param} is not supported by this server", param=param,
                    code="unsupported_parameter")


def from_engine(exc: RequestError | QueueFull | EngineUnavailable | LoadRefused,
                param: str | None = None) -> APIError:
    if isinstance(exc, LoadRefused):
        status, code = LOAD_REFUSED[exc.kind]
        return APIError(str(exc), status, param="model", code=code)
    if isinstance(exc, EngineUnavailable):
        return APIError(str(exc), 503, code="engine_unavailable", type="server_error",
                        headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, QueueFull):
        return APIError(str(exc), 429, code="queue_full",
                        headers={"Retry-After": str(exc.retry_after)})
    return APIError(str(exc), 400, param=param, code="invalid_request")


def error_response(message: str, status_code: int, type: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> Response[Any]:
    body = ErrorResponse(ErrorDetail(message, type, param, code))
    return Response(body, status_code=status_code, headers=headers)


_AT = re.compile(r"at `\$\.([A-Za-z0-9_]+)")


def _validation_detail(exc: ValidationException) -> tuple[str, str | None]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    for item in extra:
        if isinstance(item, dict) and item.get("message"):
            message = str(item["message"])
            match = _AT.search(message)
            param = match.group(1) if match else item.get("key") or None
            if param == "data":
                param = None
            return f"invalid request body: {message}", param
    return str(exc.detail), None


def api_exception_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, APIError):
        return error_response(exc.message, exc.status_code, exc.type, exc.param, exc.code,
                              exc.headers)
    if isinstance(exc, ValidationException):
        message, param = _validation_detail(exc)
        return error_response(message, 400, TYPES[400], param, "invalid_value")
    if isinstance(exc, HTTPException) and exc.status_code == 413:
        config = getattr(request.app.state, "config", None)
        limit = f" of {config.max_body_bytes} bytes" if config is not None else ""
        return error_response(f"the request body is larger than this server's limit{limit}",
                              413, TYPES[413], None, "body_too_large")
    if isinstance(exc, HTTPException):
        return error_response(str(exc.detail), exc.status_code,
                              TYPES.get(exc.status_code, "server_error"), headers=exc.headers)
    # logged with its traceback by web.app.log_unexpected (the app's after_exception hook)
    return error_response("internal server error", 500, "server_error")

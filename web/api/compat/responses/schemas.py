"""The request body of /v1/responses. Fields that need stored state (previous_response_id,
conversation, background) are declared so that they get a clear 400."""
from __future__ import annotations

from typing import Any

from msgspec import Struct


class ResponsesRequest(Struct, kw_only=True):
    model: str = ""  # "" or missing: the default model
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # text.format: text | json_object | json_schema
    reasoning: dict[str, Any] | None = None  # effort "none" turns a thinking model's off
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool | None = None  # nothing is stored; accepted as clients send it
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    include: list[str] | None = None
    service_tier: str | None = None
    keep_alive: float | str | None = None  # Ferry's, as on /v1/chat/completions
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = None

"""The request body of /v1/messages and /v1/messages/count_tokens (blocks are checked one by
one in translate.py, so that an unknown block gets a 400 naming where it is)."""
from __future__ import annotations

from typing import Any

from msgspec import Struct


class MessagesRequest(Struct, kw_only=True):
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None  # required by /v1/messages (checked there), not count_tokens
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # format (a JSON schema); effort is ignored
    metadata: dict[str, Any] | None = None  # accepted (user_id), not used
    service_tier: str | None = None  # accepted, one tier here

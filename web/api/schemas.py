"""Request and response bodies of the OpenAI-compatible API (msgspec, so /schema is exact).

Fields Ferry cannot honour are declared anyway, so that a request using them gets a clear
400 naming the field instead of being silently ignored.
"""
from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct


class TextPart(Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(Struct, kw_only=True):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(Struct, kw_only=True):
    """Fields shared by both endpoints (Ferry accepts vLLM's ignore_eos and top_k too)."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[Any]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


# -- responses -----------------------------------------------------------------------------
class PromptTokensDetails(Struct):
    cached_tokens: int


class UsageInfo(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class AssistantMessage(Struct):
    role: str
    content: str


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: str = "chat.completion"
    system_fingerprint: str | None = None


class ChatDelta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(Struct, omit_defaults=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: UsageInfo | None = None


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(Struct, omit_defaults=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    usage: UsageInfo | None = None


class ModelCard(Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "ferry"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Struct):
    error: ErrorDetail


def encode(obj: Struct) -> str:
    return msgspec.json.encode(obj).decode()

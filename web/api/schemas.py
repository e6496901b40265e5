"""Request and response bodies of the OpenAI-compatible API (msgspec, so /schema is exact).

Fields Ferry cannot honour are declared anyway, so that a request using them gets a clear
400 naming the field instead of being silently ignored.
"""
from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct


class ImageURL(Struct, kw_only=True):
    url: str  # a base64 data: URL (remote http(s) URLs are refused: fetching is off)
    detail: str | None = None  # auto, low or high: accepted; every image is processed alike


class TextPart(Struct, kw_only=True):
    """A content part: `text`, or `image_url` (vision models; web/api/vision)."""

    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class ChatMessage(Struct, kw_only=True):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # accepted back, never put in the prompt


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(Struct, kw_only=True):
    """Fields shared by both endpoints (Ferry accepts vLLM's ignore_eos and top_k too)."""

    model: str = ""  # "" or missing: the default model
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    speculative: bool = True  # Ferry's: false keeps this request out of speculative decoding
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # structured output (web/api/structured/fields.py): OpenAI's, vLLM's and llama.cpp's names
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # Ollama's: how long the model stays loaded after this request (seconds, or "5m"; 0:
    # unload when done; negative: stay); with several models only
    keep_alive: float | str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's; Ferry reads enable_thinking


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


class FunctionCall(Struct):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: str = "function"


class AssistantMessage(Struct, omit_defaults=True):
    role: str
    content: str | None  # None (null) beside tool calls, as OpenAI sends it
    reasoning_content: str | None = None  # a thinking model's reasoning (vLLM's name)
    tool_calls: list[ToolCall] | None = None


class FunctionCallDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    """One streamed piece of a tool call: the first has id, type and name, then arguments."""

    index: int
    id: str | None = None
    type: str | None = None
    function: FunctionCallDelta | None = None


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(Struct):
    """OpenAI's chat logprobs entry: the token, its log-probability, its UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(Struct):
    """Legacy completions' logprobs: parallel lists, one entry per token (prompt tokens first
    with echo; the first prompt token's log-probability is null, nothing predicts it)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChoiceEnd(Struct, kw_only=True):
    """How a choice ended; kw_only puts these after the choice's own fields. finish_reason
    speaks OpenAI's vocabulary (stop, length); Ferry's own reason is kept beside it (e.g.
    "cancelled", which OpenAI reports as "stop"). None while a streamed choice goes on."""

    finish_reason: str | None = None
    ferry_finish_reason: str | None = None


class ChatChoice(Struct):
    """A whole chat completion's choice: it has always ended, so finish_reason is required."""

    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    ferry_finish_reason: str | None = None


class ChatDelta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(ChoiceEnd):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None


class CompletionChoice(ChoiceEnd):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None


class Response(Struct):
    """What every completion body starts with; its choices come next."""

    id: str
    created: int
    model: str


class ChatCompletion(Response):
    choices: list[ChatChoice]
    usage: UsageInfo
    object: str = "chat.completion"
    system_fingerprint: str | None = None


# `object` has no default in the two omit_defaults structs: a default would be left out
class ChatCompletionChunk(Response, omit_defaults=True):
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"]
    usage: UsageInfo | None = None


class Completion(Response, omit_defaults=True):
    choices: list[CompletionChoice]
    object: Literal["text_completion"]
    usage: UsageInfo | None = None


class ModelCard(Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "ferry"
    chat_template: str | None = None  # the model's own, or the plain fallback
    architecture: str | None = None  # the registry's name ("llama", "gemma3", ...)
    runs: str | None = None  # block types and kernels, as the banner says it
    reasoning: bool = False  # replies carry reasoning_content (a thinking model)
    embedding: bool = False  # an embedding model: /v1/embeddings, no chat
    vision: bool = False  # takes images (image_url content parts; docs/vision.md)
    task: str = "generate"  # generate, embed, or rerank (a cross-encoder: /v1/rerank)
    upstreams: list[str] | None = None  # upstream mode: the upstreams that serve it
    # several models in one server: loaded or not (loading, unloading), the default, bytes
    loaded: bool = True
    state: str = "loaded"
    default: bool = True
    size: int | None = None
    keep_alive: float | None = None  # seconds idle before it unloads; None: stays
    error: str | None = None  # why its last load failed
    # "configured" (--model / models), or the store it was found in on disk: "ollama",
    # "lm studio", "hugging face cache", "model folder" (served without being configured)
    source: str = "configured"
    # while loaded: resident bytes by part (weights, kv, tokenizer, vocabulary, other, total)
    memory: dict[str, int] | None = None


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

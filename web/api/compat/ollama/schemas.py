"""Request bodies of Ollama's /api/chat, /api/generate and /api/show."""
from __future__ import annotations

from typing import Any

from msgspec import Struct


class OllamaMessage(Struct, kw_only=True):
    role: str
    content: str = ""
    thinking: str | None = None  # a thinking model's reasoning sent back: not in the prompt
    images: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


class SamplingOptions(Struct, kw_only=True):
    """The types of the `options` Ferry samples with (the others are checked by name)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    num_predict: int | None = None


class Sampled(Struct, kw_only=True):
    """What /api/chat and /api/generate share."""

    model: str
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema
    options: dict[str, Any] | None = None
    stream: bool = True  # Ollama streams unless told not to
    keep_alive: float | str | None = None
    think: bool | str | None = None


class ChatRequest(Sampled, kw_only=True):
    messages: list[OllamaMessage] = []
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(Sampled, kw_only=True):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[str] | None = None
    context: list[int] | None = None


class ShowRequest(Struct, kw_only=True):
    model: str = ""
    name: str = ""  # older clients' name for it
    verbose: bool = False

"""Ollama chat and generate requests -> the chat request; replies and stream lines back."""
from __future__ import annotations

import json
import time
from typing import Any

from engine import FinalEvent
from web.api.compat.ollama.options import sampling, tagged
from web.api.compat.ollama.schemas import ChatRequest, GenerateRequest
from web.api.errors import APIError, unsupported
from web.api.schemas import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatMessage,
    ImageURL,
    TextPart,
)

ROLES = ("system", "user", "assistant", "tool")
NS = 1_000_000_000


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + \
        f".{int(time.time() * 1e6) % 1_000_000:06d}Z"


def _calls(calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(f"{where}[{j}].function.name is missing",
                           param=f"{where}[{j}].function")
        args = fn.get("arguments") or {}
        if not isinstance(args, (dict, str)):
            raise APIError(f"{where}[{j}].function.arguments must be an object",
                           param=f"{where}[{j}].function.arguments")
        out.append({"id": f"call_{j}", "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def chat_request(body: ChatRequest) -> ChatCompletionRequest:
    if not body.messages:
        raise APIError("messages must not be empty", param="messages")
    messages = []
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        if m.role not in ROLES:
            raise APIError(f"{where}.role must be one of {', '.join(ROLES)}, got {m.role!r}",
                           param=f"{where}.role")
        calls = _calls(m.tool_calls, f"{where}.tool_calls") if m.tool_calls else None
        content = _with_images(m.content, m.images) if m.images else m.content
        messages.append(ChatMessage(role=m.role, content=content, tool_calls=calls))
    tools = body.tools
    return ChatCompletionRequest(messages=messages, tools=tools,
                                 tool_choice="auto" if tools else None, **sampling(body))


def generate_request(body: GenerateRequest) -> ChatCompletionRequest:
    """The prompt as one user turn (with the system prompt) through the model's template."""
    for name in ("suffix", "template", "context"):
        if getattr(body, name):
            raise unsupported(name)
    if body.raw:
        raise unsupported("raw", "raw prompts (use /v1/completions)")
    messages = [ChatMessage(role="system", content=body.system)] if body.system else []
    messages.append(ChatMessage(role="user", content=_with_images(body.prompt, body.images)
                                if body.images else body.prompt))
    return ChatCompletionRequest(messages=messages, **sampling(body))


def _with_images(text: str | None, images: list[str]) -> list[TextPart]:
    """Ollama's `images` (base64 files, no data: prefix) as OpenAI content parts, the images
    before the text (vision models; web/api/vision checks and decodes them). The media type
    is a label only: the file's own bytes say what it is."""
    parts = [TextPart(type="image_url", image_url=ImageURL(url=f"data:image/png;base64,{b64}"))
             for b64 in images]
    return [*parts, TextPart(type="text", text=text or "")]


def _message(m: AssistantMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": m.content or ""}
    if m.reasoning_content:
        out["thinking"] = m.reasoning_content
    if m.tool_calls:
        out["tool_calls"] = [{"function": {"name": c.function.name,
                                           "arguments": json.loads(c.function.arguments
                                                                   or "{}")}}
                             for c in m.tool_calls]
    return out


def stats(final: FinalEvent) -> dict[str, Any]:
    """done_reason and Ollama's counts and durations (nanoseconds)."""
    t, u = final.timings, final.usage
    ttft = t.ttft or 0.0
    return {"done": True, "done_reason": "length" if final.finish_reason == "length" else "stop",
            "total_duration": int((t.total or 0.0) * NS), "load_duration": 0,
            "prompt_eval_count": u.prompt_tokens, "prompt_eval_duration": int(ttft * NS),
            "eval_count": u.completion_tokens,
            "eval_duration": int(max(0.0, (t.total or 0.0) - ttft - (t.queued or 0.0)) * NS)}


def chat_reply(model: str, m: AssistantMessage, final: FinalEvent) -> dict[str, Any]:
    return {"model": tagged(model), "created_at": now(), "message": _message(m), **stats(final)}


def generate_reply(model: str, m: AssistantMessage, final: FinalEvent) -> dict[str, Any]:
    out = {"model": tagged(model), "created_at": now(), "response": m.content or "",
           **stats(final)}
    if m.reasoning_content:
        out["thinking"] = m.reasoning_content
    return out


def load_reply(model: str, unload: bool) -> dict[str, Any]:
    """An empty prompt loads the model (keep_alive 0: unloads it), as Ollama does."""
    return {"model": tagged(model), "created_at": now(), "response": "", "done": True,
            "done_reason": "unload" if unload else "load"}

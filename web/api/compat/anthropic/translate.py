"""Anthropic messages and content blocks <-> the chat path's messages, tools and replies."""
from __future__ import annotations

import json
from typing import Any

from engine import Tokenizer
from web.api.compat.anthropic.schemas import MessagesRequest
from web.api.errors import APIError, unsupported
from web.api.schemas import ChatChoice, ChatCompletionRequest, ChatMessage, TextPart, UsageInfo

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def _text(value: Any, where: str) -> str:
    """A string, or a list of text blocks (system prompts, tool results), as one text."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(f"{where}: expected a string or a list of text blocks", param=where)
    texts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise unsupported(f"{where}.{j}.type", f"a content block of type {kind!r} here")
        texts.append(block["text"])
    return "".join(texts)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise APIError(f"{where}: expected a string or a list of content blocks", param=where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise APIError(f"{where}.{j}: a content block needs a type", param=f"{where}.{j}")
    return content


def _user(content: Any, where: str) -> list[ChatMessage]:
    """A user turn: tool results become tool messages (first, as the template expects them
    right after the calls), the text one user message."""
    tools, texts = [], []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.{j}"
        if block["type"] == "text":
            texts.append(_text([block], at))
        elif block["type"] == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise APIError(f"{at}.tool_use_id: a tool_result needs the tool_use_id it "
                               "answers", param=f"{at}.tool_use_id")
            result = _text(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):
                result = f"Error: {result}"
            tools.append(ChatMessage(role="tool", content=result,
                                     tool_call_id=block["tool_use_id"]))
        else:
            raise unsupported(f"{at}.type", f"a user content block of type {block['type']!r}")
    return tools + ([ChatMessage(role="user", content=[TextPart(type="text", text=t)
                                                       for t in texts])] if texts else [])


def _assistant(content: Any, where: str) -> ChatMessage:
    """An assistant turn: its text, its tool calls; thinking is never put back in the prompt."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.{j}"
        if block["type"] == "text":
            texts.append(_text([block], at))
        elif block["type"] == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input"),
                                                                         dict):
                raise APIError(f"{at}: a tool_use block needs a name and an input object",
                               param=at)
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"],
                                       "arguments": json.dumps(block["input"])}})
        elif block["type"] not in ("thinking", "redacted_thinking"):
            raise unsupported(f"{at}.type",
                              f"an assistant content block of type {block['type']!r}")
    return ChatMessage(role="assistant", content="".join(texts), tool_calls=calls or None)


def _tools(body: MessagesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    tools = []
    for i, tool in enumerate(body.tools or []):
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise unsupported(f"tools.{i}", f"the tool {tool.get('name') or tool.get('type')!r}"
                              " (only custom tools with a name and an input_schema)")
        tools.append({"type": "function", "function": {
            "name": tool["name"], "description": tool.get("description", ""),
            "parameters": tool.get("input_schema") or {"type": "object"}}})
    choice = body.tool_choice
    if choice is None:
        return tools or None, None
    kind = choice.get("type")
    if choice.get("disable_parallel_tool_use"):
        raise unsupported("tool_choice.disable_parallel_tool_use")
    mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if kind == "tool":
        mapped = {"type": "function", "function": {"name": choice.get("name")}}
    if mapped is None:
        raise APIError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}",
                       param="tool_choice.type")
    return tools or None, mapped


def _thinking(body: MessagesRequest) -> dict[str, Any] | None:
    kind = (body.thinking or {}).get("type")
    if kind is None:
        return None
    if kind not in ("enabled", "disabled"):
        raise APIError(f"thinking.type must be enabled or disabled, got {kind!r}",
                       param="thinking.type")
    return {"enable_thinking": kind == "enabled"}


def _format(body: MessagesRequest) -> dict[str, Any] | None:
    """output_config.format (structured outputs) as the chat path's response_format."""
    fmt = (body.output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or \
            not isinstance(fmt.get("schema"), dict):
        raise APIError("output_config.format must be {\"type\": \"json_schema\", "
                       "\"schema\": {...}}", param="output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_request(body: MessagesRequest, count_only: bool = False) -> ChatCompletionRequest:
    """The chat request that answers `body` (400s name Anthropic's field paths)."""
    if not count_only:
        if body.max_tokens is None:
            raise APIError("max_tokens: Field required", param="max_tokens")
        if body.max_tokens < 1:
            raise APIError("max_tokens: must be at least 1", param="max_tokens")
    if not body.messages:
        raise APIError("messages: at least one message is required", param="messages")
    messages = [] if body.system is None else \
        [ChatMessage(role="system", content=_text(body.system, "system"))]
    for i, message in enumerate(body.messages):
        where, role = f"messages.{i}", message.get("role")
        if role == "user":
            messages.extend(_user(message.get("content"), f"{where}.content"))
        elif role == "assistant":
            messages.append(_assistant(message.get("content"), f"{where}.content"))
        else:
            raise APIError(f"{where}.role: must be user or assistant, got {role!r}",
                           param=f"{where}.role")
    tools, choice = _tools(body)
    return ChatCompletionRequest(
        model=body.model, messages=messages, max_tokens=body.max_tokens,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
        stop=body.stop_sequences, tools=tools, tool_choice=choice,
        chat_template_kwargs=_thinking(body), response_format=_format(body))


def stop_reason(finish: str | None, text: str, stops: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): `text` is the whole output decoded, the matched stop
    sequence still in it (the engine cuts it from the reply, not from the tokens)."""
    if finish in STOP_REASONS:
        return STOP_REASONS[finish], None
    matched = next((s for s in stops or [] if s in text), None)
    return ("stop_sequence", matched) if matched is not None else ("end_turn", None)


def usage(info: UsageInfo) -> dict[str, int]:
    cached = info.prompt_tokens_details.cached_tokens if info.prompt_tokens_details else 0
    return {"input_tokens": info.prompt_tokens, "output_tokens": info.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def message(mid: str, model: str, choice: ChatChoice, info: UsageInfo,
            stop: tuple[str, str | None]) -> dict[str, Any]:
    """The whole reply as an Anthropic Message: thinking, text, then tool_use blocks."""
    m = choice.message
    content: list[dict[str, Any]] = []
    if m.reasoning_content:
        content.append({"type": "thinking", "thinking": m.reasoning_content, "signature": ""})
    if m.content:
        content.append({"type": "text", "text": m.content})
    for call in m.tool_calls or []:
        content.append({"type": "tool_use", "id": call.id, "name": call.function.name,
                        "input": json.loads(call.function.arguments or "{}")})
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": usage(info)}


def output_text(tokenizer: Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)

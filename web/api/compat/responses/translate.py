"""Responses input items <-> the chat path's messages, tools and structured output; the
reply's chat choice -> output items and the response object."""
from __future__ import annotations

import time
from typing import Any

from web.api.compat.responses.schemas import ResponsesRequest
from web.api.errors import APIError, unsupported
from web.api.schemas import ChatChoice, ChatCompletionRequest, ChatMessage, UsageInfo

ROLES = ("user", "system", "developer", "assistant")
NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format",
         "messages": "input"}  # the chat path's fields as the Responses API calls them
TEXT_PARTS = ("input_text", "output_text", "text")


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise unsupported(f"{where}[{j}].type", f"content of type {kind!r}")
        texts.append(part["text"])
    return "".join(texts)


def _messages(body: ResponsesRequest) -> list[ChatMessage]:
    out = [] if body.instructions is None else \
        [ChatMessage(role="system", content=body.instructions)]
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) \
        else body.input
    if not items:
        raise APIError("input must not be empty", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise APIError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}",
                               param=f"{where}.role")
            out.append(ChatMessage(role=role, content=_content(item.get("content"),
                                                               f"{where}.content")))
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"),
                                                                        str):
                raise APIError(f"{where}: a function_call needs call_id and name",
                               param=where)
            if not isinstance(item.get("arguments", ""), str):
                raise APIError(f"{where}.arguments must be JSON text",
                               param=f"{where}.arguments")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"],
                                 "arguments": item.get("arguments") or "{}"}}
            if out and out[-1].role == "assistant":  # calls of one turn stay together
                out[-1].tool_calls = [*(out[-1].tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(f"{where}.call_id is missing", param=f"{where}.call_id")
            out.append(ChatMessage(role="tool", tool_call_id=item["call_id"],
                                   content=_content(item.get("output", ""),
                                                    f"{where}.output")))
        elif kind != "reasoning":  # reasoning is never put back in the prompt
            raise unsupported(f"{where}.type", f"input items of type {kind!r}")
    return out


def _tools(body: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    tools = []
    for i, tool in enumerate(body.tools or []):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise unsupported(f"tools[{i}].type", f"tools of type {tool.get('type')!r} "
                              "(function tools only)")
        tools.append({"type": "function", "function": {
            "name": tool["name"], "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object"}}})
    choice: Any = body.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise unsupported("tool_choice.type", f"tool_choice of type {choice.get('type')!r}")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return tools or None, choice


def _format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = (body.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise APIError("text.format must be an object", param="text.format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema"),
            "strict": fmt.get("strict")}}
    raise APIError(f"text.format.type must be text, json_object or json_schema, got "
                   f"{fmt.get('type')!r}", param="text.format.type")


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that answers `body`; what needs stored state is a 400."""
    if body.previous_response_id is not None:
        raise APIError("previous_response_id is not supported: this server keeps no "
                       "responses; send the whole conversation as input items",
                       param="previous_response_id", code="unsupported_parameter")
    if body.conversation is not None:
        raise unsupported("conversation", "conversation (this server keeps no state)")
    if body.background:
        raise unsupported("background", "background responses")
    if body.top_logprobs:
        raise unsupported("top_logprobs")
    tools, choice = _tools(body)
    effort = (body.reasoning or {}).get("effort")
    return ChatCompletionRequest(
        model=body.model, messages=_messages(body), max_tokens=body.max_output_tokens,
        temperature=body.temperature, top_p=body.top_p, tools=tools, tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls, response_format=_format(body),
        keep_alive=body.keep_alive,
        chat_template_kwargs={"enable_thinking": False} if effort == "none" else None)


def reasoning_item(rid: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{rid}", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def message_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if text or \
        status == "completed" else []
    return {"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant",
            "content": content}


def call_item(call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(rid: str, choice: ChatChoice) -> list[dict[str, Any]]:
    m, items = choice.message, []
    if m.reasoning_content:
        items.append(reasoning_item(rid, m.reasoning_content))
    if m.content or not m.tool_calls:
        items.append(message_item(rid, m.content or ""))
    items += [call_item(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
    return items


def usage(info: UsageInfo) -> dict[str, Any]:
    cached = info.prompt_tokens_details.cached_tokens if info.prompt_tokens_details else 0
    return {"input_tokens": info.prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": info.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": info.total_tokens}


def response(rid: str, created: int, model: str, body: ResponsesRequest,
             items: list[dict[str, Any]], finish: str | None,
             info: UsageInfo | None) -> dict[str, Any]:
    """The response object; finish None: still in progress."""
    status = "in_progress" if finish is None else \
        "incomplete" if finish == "length" else "completed"
    return {"id": f"resp_{rid}", "object": "response", "created_at": created or int(time.time()),
            "status": status, "model": model, "output": items, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "tools": body.tools or [], "tool_choice": body.tool_choice or "auto",
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": body.temperature, "top_p": body.top_p,
            "text": body.text or {"format": {"type": "text"}}, "reasoning": body.reasoning,
            "metadata": body.metadata or {}, "previous_response_id": None, "store": False,
            "truncation": "disabled", "usage": usage(info) if info is not None else None}

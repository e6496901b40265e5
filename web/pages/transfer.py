"""A conversation exported as Markdown or JSON, and imported back from that JSON.

A reply's reasoning (a thinking model's) travels as its own `reasoning` field, and in
Markdown as a collapsed <details> block above the answer."""
from __future__ import annotations

import json
from typing import Any

from web.pages.chat_service import ChatError, title_for
from web.storage.store import Conversation, Message, Store

FORMAT = "ferry-conversation"
VERSION = 1
SETTINGS = ("system_prompt", "temperature", "top_p", "max_tokens")


def _message(m: Message) -> dict[str, Any]:
    out = {"role": m.role, "content": m.content, "status": m.status,
           "finish_reason": m.finish_reason, "created": m.created}
    return {**out, "reasoning": m.reasoning} if m.reasoning else out


def to_json(conv: Conversation, messages: list[Message]) -> dict[str, Any]:
    settings: dict[str, Any] = {name: getattr(conv, name) for name in SETTINGS}
    settings["enable_thinking"] = None if conv.enable_thinking is None else conv.thinking
    return {
        "format": FORMAT, "version": VERSION, "title": conv.title, "created": conv.created,
        "settings": settings,
        "messages": [_message(m) for m in messages if not m.is_streaming],
    }


def to_markdown(conv: Conversation, messages: list[Message]) -> str:
    parts = [f"# {conv.title}\n"]
    if conv.system_prompt:
        parts.append(f"> System prompt: {conv.system_prompt}\n")
    for m in messages:
        if m.is_streaming:
            continue
        who = "You" if m.role == "user" else "Assistant"
        thought = f"<details><summary>Thinking</summary>\n\n{m.reasoning.strip()}\n\n" \
            "</details>\n\n" if m.reasoning else ""
        parts.append(f"## {who}\n\n{thought}{m.content.rstrip()}\n")
    return "\n".join(parts)


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ChatError(f"the file's {name!r} has the wrong type", 400)
    return value


def from_json(store: Store, owner: str, raw: bytes, max_messages: int) -> Conversation:
    """A new conversation of `owner` from an exported file (raises ChatError, 400)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ChatError("the file is not JSON", 400) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatError(f"the file is not a Ferry conversation (format {FORMAT!r})", 400)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ChatError("the file has no messages", 400)
    if len(messages) > max_messages:
        raise ChatError(f"the file has {len(messages)} messages (at most {max_messages})", 400)
    checked = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or \
                not isinstance(m.get("content"), str):
            raise ChatError("each message needs a role (user or assistant) and a content", 400)
        checked.append((m["role"], m["content"], m.get("finish_reason"),
                        _field(m, "reasoning", str)))
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):
        raise ChatError("the file's 'settings' has the wrong type", 400)
    system = _field(settings, "system_prompt", str)
    temperature = _field(settings, "temperature", (int, float))
    top_p = _field(settings, "top_p", (int, float))
    max_tokens = _field(settings, "max_tokens", int)
    thinking = settings.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise ChatError("the file's 'enable_thinking' has the wrong type", 400)
    if (temperature is not None and not 0 <= temperature <= 2) or \
            (top_p is not None and not 0 < top_p <= 1) or \
            (max_tokens is not None and max_tokens < 1):
        raise ChatError("the file's settings are out of range", 400)
    title = _field(data, "title", str) or title_for(checked[0][1])
    conv = store.create_conversation(owner, title_for(title, 200))
    store.set_settings(conv.id, system, temperature, top_p, max_tokens, thinking)
    for role, content, reason, reasoning in checked:
        status = "incomplete" if reason in ("cancelled", "error") else "complete"
        reasoning = reasoning if role == "assistant" else None
        msg = store.add_message(conv.id, role, content, status, reasoning=reasoning)
        if role == "assistant" and isinstance(reason, str):
            store.finish_message(msg.id, content, status, reason, reasoning=reasoning)
    found = store.conversation(conv.id)
    assert found is not None
    return found

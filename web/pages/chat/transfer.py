"""A conversation exported as Markdown or JSON, and imported back from that JSON.

A reply's reasoning (a thinking model's) travels as its own `reasoning` field, and in
Markdown as a collapsed <details> block above the answer. The conversation's model travels
as `model` (its name); an import whose model this server does not serve goes on with the
default model, and the page says so. A message's pictures travel as `images`, each
`{"media_type", "data"}` (the file as sent, base64), checked on import like an attachment;
Markdown lists them by type and size."""
from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from web.config import WebConfig
from web.pages.chat.rules import ChatError, Settings, check_settings, title_for
from web.pages.chat.uploads import checked_images
from web.storage.images import NewImage, StoredImage
from web.storage.store import Conversation, Message, Store

FORMAT = "ferry-conversation"
VERSION = 1
SETTINGS = ("system_prompt", "temperature", "top_p", "max_tokens")
ROLES = ("user", "assistant")
REASONS = ("stop", "length", "cancelled", "error")  # engine.FinishReason


def _message(m: Message, store: Store, images: list[StoredImage]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content, "status": m.status,
                           "finish_reason": m.finish_reason, "created": m.created}
    if m.model:  # the model that wrote this reply (several models)
        out["model"] = m.model
    if images:
        out["images"] = [{"media_type": im.media_type, "data": base64.b64encode(
            store.image_data(im.id) or b"").decode("ascii")} for im in images]
    return {**out, "reasoning": m.reasoning} if m.reasoning else out


def to_json(conv: Conversation, messages: list[Message], model: str,
            store: Store) -> dict[str, Any]:
    """`model`: the name of the model the conversation chats with (the default's, if none);
    `store`: where the messages' pictures are read from."""
    images = store.images(conv.id)
    settings: dict[str, Any] = {name: getattr(conv, name) for name in SETTINGS}
    settings["enable_thinking"] = None if conv.enable_thinking is None else conv.thinking
    return {
        "format": FORMAT, "version": VERSION, "title": conv.title, "created": conv.created,
        "model": model, "settings": settings,
        "messages": [_message(m, store, images.get(m.id, [])) for m in messages
                     if not m.is_streaming],
    }


def to_markdown(conv: Conversation, messages: list[Message], model: str,
                images: dict[int, list[StoredImage]] | None = None) -> str:
    parts = [f"# {conv.title}\n", f"> Model: {model}\n"]
    if conv.system_prompt:
        parts.append(f"> System prompt: {conv.system_prompt}\n")
    for m in messages:
        if m.is_streaming:
            continue
        who = "You" if m.role == "user" else "Assistant"
        thought = f"<details><summary>Thinking</summary>\n\n{m.reasoning.strip()}\n\n" \
            "</details>\n\n" if m.reasoning else ""
        pictures = "".join(f"*(picture: {im.media_type}, {im.width}x{im.height}, "
                           f"{im.size / 1e3:.0f} kB)*\n\n"
                           for im in (images or {}).get(m.id, []))
        parts.append(f"## {who}\n\n{thought}{pictures}{m.content.rstrip()}\n")
    return "\n".join(parts)


def _refuse(field: str, what: str) -> ChatError:
    return ChatError(f"the file's {field} {what}", 400)


def _text(value: object, field: str, required: bool = False) -> str | None:
    """A string field, which must be text SQLite can keep (no lone surrogates)."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _refuse(field, "must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(field, "is not valid text (it holds a lone UTF-16 surrogate)") from None
    return value


def _number(value: object, field: str, kinds: tuple[type, ...]) -> Any:
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
        raise _refuse(field, "must be a whole number" if kinds == (int,) else "must be a number")
    return value


def _settings(data: object, config: WebConfig) -> Settings:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _refuse("'settings'", "must be an object")
    names = {name: f"settings.{name}" for name in SETTINGS}
    system = _text(data.get("system_prompt"), names["system_prompt"])
    temperature = _number(data.get("temperature"), names["temperature"], (int, float))
    top_p = _number(data.get("top_p"), names["top_p"], (int, float))
    max_tokens = _number(data.get("max_tokens"), names["max_tokens"], (int,))
    return check_settings(config.max_tokens_limit, system, temperature, top_p, max_tokens,
                          names={k: f"the file's {v}" for k, v in names.items()})


def _messages(data: object, config: WebConfig
              ) -> list[tuple[str, str, str, str | None, str | None, str | None]]:
    if not isinstance(data, list) or not data:
        raise ChatError("the file has no messages", 400)
    if len(data) > config.max_messages:
        raise ChatError(f"the file has {len(data)} messages (at most {config.max_messages})",
                        400)
    checked = []
    for i, m in enumerate(data):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _refuse(where, "must be an object")
        if m.get("role") not in ROLES:
            raise _refuse(f"{where}.role", "must be user or assistant")
        content = _text(m.get("content"), f"{where}.content", required=True)
        assert content is not None
        if len(content.encode()) > config.max_body_bytes:
            raise _refuse(f"{where}.content", f"is longer than {config.max_body_bytes} bytes")
        reason = _text(m.get("finish_reason"), f"{where}.finish_reason")
        if reason is not None and (m["role"] != "assistant" or reason not in REASONS):
            raise _refuse(f"{where}.finish_reason",
                          f"must be one of {', '.join(REASONS)} (on a reply)")
        status = _text(m.get("status"), f"{where}.status")
        if status is not None and status not in ("complete", "incomplete"):
            raise _refuse(f"{where}.status", "must be complete or incomplete")
        _number(m.get("created"), f"{where}.created", (int, float))
        reasoning = _text(m.get("reasoning"), f"{where}.reasoning")  # a reply's thinking
        if reason in ("cancelled", "error"):
            status = "incomplete"
        wrote = _text(m.get("model"), f"{where}.model")  # a label: need not be served here
        reply = m["role"] == "assistant"
        checked.append((m["role"], content, status or "complete", reason,
                        reasoning if reply else None, wrote[:200] if reply and wrote else None))
    return checked


def _images(data: list[Any], config: WebConfig) -> dict[int, list[NewImage]]:
    """The messages' pictures by message index, each checked like an attachment, the whole
    conversation's within its limit."""
    found: dict[int, list[tuple[str, bytes]]] = {}
    for i, m in enumerate(data):
        listed = m.get("images")
        if listed is None:
            continue
        where = f"messages[{i}].images"
        if not isinstance(listed, list) or (listed and m["role"] != "user"):
            raise _refuse(where, "must be a list (on a user's message)")
        if len(listed) > config.max_images:  # as many as one message may carry
            raise _refuse(where, f"holds {len(listed)} pictures; a message may carry at most "
                                 f"{config.max_images}")
        for j, item in enumerate(listed):
            if not isinstance(item, dict) or not isinstance(item.get("data"), str):
                raise _refuse(f"{where}[{j}]", "must be an object with base64 `data`")
            try:
                raw = base64.b64decode(item["data"], validate=True)
            except (binascii.Error, ValueError):
                raise _refuse(f"{where}[{j}].data", "is not base64") from None
            found.setdefault(i, []).append((f"{where}[{j}]", raw))
    total = [pair for pairs in found.values() for pair in pairs]
    checked = iter(checked_images(total, config, per_message=False))
    return {i: [next(checked) for _ in pairs] for i, pairs in found.items()}


# a file's model name -> (the name stored, or None for the default; the file's name when this
# server does not serve it, else None)
PickModel = Callable[[str | None], tuple[str | None, str | None]]


def from_json(store: Store, owner: str, raw: bytes, config: WebConfig,
              pick_model: PickModel) -> tuple[Conversation, str | None]:
    """A new conversation of `owner` from an exported file, every field checked by the rules
    the Settings form and the API use (ChatError 400 naming the field), stored in one
    transaction: a refused or failed import leaves nothing behind (pictures are decoded here:
    call it off the event loop). Also returns the file's
    model when it is not served here (the conversation then chats with the default)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ChatError("the file is not JSON", 400) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatError(f"the file is not a Ferry conversation (format {FORMAT!r})", 400)
    version = _number(data.get("version", VERSION), "version", (int,))
    if version != VERSION:
        raise _refuse("version", f"is {version}; this Ferry reads version {VERSION}")
    _number(data.get("created"), "created", (int, float))
    settings = _settings(data.get("settings"), config)
    thinking = (data.get("settings") or {}).get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise _refuse("settings.enable_thinking", "must be true or false")
    messages = _messages(data.get("messages"), config)
    images = _images(data["messages"], config)
    model, unknown = pick_model(_text(data.get("model"), "model"))
    title = _text(data.get("title"), "title") or ""
    title = title_for(" ".join(title.split()) or title_for(messages[0][1]) or "Pictures", 200)
    conv = store.import_conversation(owner, title, settings, messages, thinking, model, images)
    return conv, unknown

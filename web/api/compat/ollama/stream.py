"""Ollama's streams: NDJSON, one object a line (a piece of the reply, `done: false`), the
last with `done: true` and the counts; a failure ends it with an `{"error": ...}` line."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request

from engine import FinalEvent
from web.api.compat.ollama import translate
from web.api.compat.ollama.options import tagged
from web.api.compat.run import ChatRun, deltas
from web.api.errors import APIError
from web.api.schemas import AssistantMessage, ChatChunkChoice


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _piece(choice: ChatChunkChoice) -> AssistantMessage | None:
    """The text of one delta (its tool calls come whole at the end)."""
    d = choice.delta
    if not (d.content or d.reasoning_content):
        return None
    return AssistantMessage("assistant", d.content or "", d.reasoning_content)


async def lines(request: Request[Any, Any, Any], run: ChatRun, chat: bool
                ) -> AsyncIterator[bytes]:
    """The reply's lines; tool calls come whole in the last line but one (as Ollama sends
    them), read from the finished reply."""
    model = tagged(run.model)
    async for item in deltas(request, run):
        if isinstance(item, APIError):
            yield _line({"error": item.message})
            return
        if isinstance(item, FinalEvent):
            if chat:
                whole = run.shape.choice(0, run.handle, item).message
                if whole.tool_calls:
                    calls = translate.chat_reply(model, whole, item)["message"]["tool_calls"]
                    yield _line({"model": model, "created_at": translate.now(), "done": False,
                                 "message": {"role": "assistant", "content": "",
                                             "tool_calls": calls}})
            end = {"model": model, "created_at": translate.now(), **translate.stats(item)}
            yield _line({**end, "message": {"role": "assistant", "content": ""}} if chat
                        else {**end, "response": ""})
            return
        piece = _piece(item)
        if piece is None:
            continue
        head = {"model": model, "created_at": translate.now(), "done": False}
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": piece.content or ""}
            if piece.reasoning_content:
                message["thinking"] = piece.reasoning_content
            yield _line({**head, "message": message})
        else:
            out = {**head, "response": piece.content or ""}
            if piece.reasoning_content:
                out["thinking"] = piece.reasoning_content
            yield _line(out)

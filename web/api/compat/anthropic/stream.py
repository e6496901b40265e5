"""Anthropic's stream: message_start, ping, then per content block content_block_start /
content_block_delta / content_block_stop (thinking, text, tool_use), then message_delta
(stop reason, output tokens) and message_stop; a failure ends it with an `error` event."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request
from sse_starlette import ServerSentEvent

from engine import FinalEvent
from web.api.compat.anthropic.errors import anthropic_error
from web.api.compat.anthropic.translate import output_text, stop_reason
from web.api.compat.run import ChatRun, deltas
from web.api.errors import APIError
from web.api.schemas import ChatChunkChoice


def event(kind: str, **data: Any) -> ServerSentEvent:
    return ServerSentEvent(json.dumps({"type": kind, **data}), event=kind)


class Blocks:
    """The open content block: a new kind of delta closes it and opens the next."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def open(self, kind: str, block: dict[str, Any]) -> list[ServerSentEvent]:
        out = self.close()
        self.index, self.kind = self.index + 1, kind
        return out + [event("content_block_start", index=self.index, content_block=block)]

    def need(self, kind: str, block: dict[str, Any]) -> list[ServerSentEvent]:
        return [] if self.kind == kind else self.open(kind, block)

    def close(self) -> list[ServerSentEvent]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", index=self.index)]

    def delta(self, delta: dict[str, Any]) -> ServerSentEvent:
        return event("content_block_delta", index=self.index, delta=delta)


def _render(blocks: Blocks, choice: ChatChunkChoice) -> list[ServerSentEvent]:
    d, out = choice.delta, []
    if d.reasoning_content:
        out += blocks.need("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        out.append(blocks.delta({"type": "thinking_delta", "thinking": d.reasoning_content}))
    if d.content:
        out += blocks.need("text", {"type": "text", "text": ""})
        out.append(blocks.delta({"type": "text_delta", "text": d.content}))
    for call in d.tool_calls or []:
        if call.id is not None:
            name = call.function.name if call.function else None
            out += blocks.open("tool_use", {"type": "tool_use", "id": call.id, "name": name,
                                            "input": {}})
        if call.function is not None and call.function.arguments:
            out.append(blocks.delta({"type": "input_json_delta",
                                     "partial_json": call.function.arguments}))
    return out


async def events(request: Request[Any, Any, Any], run: ChatRun, mid: str,
                 stops: list[str] | None, shutdown: anyio.Event
                 ) -> AsyncIterator[ServerSentEvent]:
    start: dict[str, Any] = {"id": mid, "type": "message", "role": "assistant", "model": run.model,
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": run.handle.prompt_tokens, "output_tokens": 0}}
    yield event("message_start", message=start)
    yield event("ping")
    blocks, finish = Blocks(), None
    async for item in deltas(request, run, shutdown):
        if isinstance(item, APIError):
            body = anthropic_error(item.status_code, item.message, item.param)
            yield ServerSentEvent(json.dumps(body), event="error")
            return
        if isinstance(item, FinalEvent):
            for e in blocks.close():
                yield e
            text = output_text(run.s.tokenizer, run.handle.token_ids)
            reason, sequence = stop_reason(finish, text, stops)
            yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                        usage={"output_tokens": item.usage.completion_tokens})
            yield event("message_stop")
            return
        finish = item.finish_reason or finish
        for e in _render(blocks, item):
            yield e

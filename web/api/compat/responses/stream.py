"""The Responses stream: response.created, response.in_progress, then for each output item
response.output_item.added, its parts and deltas (output_text, reasoning_text, function-call
arguments), their .done events and response.output_item.done, and at the end
response.completed (or response.incomplete at max_output_tokens); a failure sends `error`.
Every event carries its sequence_number."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request
from sse_starlette import ServerSentEvent

from engine import FinalEvent
from web.api.compat.responses import translate
from web.api.compat.responses.schemas import ResponsesRequest
from web.api.compat.run import ChatRun, deltas
from web.api.errors import APIError
from web.api.schemas import ChatChunkChoice, PromptTokensDetails, UsageInfo


class Items:
    """The output items so far; the open one gets the deltas of its kind."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.kind: str | None = None
        self.text = ""

    def event(self, kind: str, **data: Any) -> ServerSentEvent:
        body = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return ServerSentEvent(json.dumps(body), event=kind)

    @property
    def at(self) -> dict[str, Any]:
        return {"output_index": len(self.items) - 1, "item_id": self.items[-1]["id"]}

    def open(self, kind: str, item: dict[str, Any]) -> list[ServerSentEvent]:
        out = self.close()
        self.items.append(item)
        self.kind, self.text = kind, ""
        out.append(self.event("response.output_item.added", output_index=len(self.items) - 1,
                              item=item))
        if kind == "message":
            out.append(self.event("response.content_part.added", **self.at, content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def need(self, kind: str) -> list[ServerSentEvent]:
        if self.kind == kind:
            return []
        if kind == "message":
            return self.open(kind, translate.message_item(self.rid, "", "in_progress"))
        item = translate.reasoning_item(self.rid, "")
        return self.open(kind, {**item, "content": [], "status": "in_progress"})

    def close(self) -> list[ServerSentEvent]:
        kind, text = self.kind, self.text
        out: list[ServerSentEvent] = []
        if kind is None:
            return out
        self.kind = None
        if kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self.event("response.output_text.done", **self.at, content_index=0,
                                  text=text))
            out.append(self.event("response.content_part.done", **self.at, content_index=0,
                                  part=part))
            self.items[-1] = translate.message_item(self.rid, text)
        elif kind == "reasoning":
            out.append(self.event("response.reasoning_text.done", **self.at, content_index=0,
                                  text=text))
            self.items[-1] = translate.reasoning_item(self.rid, text)
        else:
            item = self.items[-1]
            out.append(self.event("response.function_call_arguments.done", **self.at,
                                  name=item["name"], arguments=text))
            self.items[-1] = translate.call_item(item["call_id"], item["name"], text)
        out.append(self.event("response.output_item.done", output_index=len(self.items) - 1,
                              item=self.items[-1]))
        return out

    def render(self, choice: ChatChunkChoice) -> list[ServerSentEvent]:
        d, out = choice.delta, []
        if d.reasoning_content:
            out += self.need("reasoning")
            self.text += d.reasoning_content
            out.append(self.event("response.reasoning_text.delta", **self.at, content_index=0,
                                  delta=d.reasoning_content))
        if d.content:
            out += self.need("message")
            self.text += d.content
            out.append(self.event("response.output_text.delta", **self.at, content_index=0,
                                  delta=d.content, logprobs=[]))
        for call in d.tool_calls or []:
            if call.id is not None:
                name = call.function.name if call.function else ""
                out += self.open("call", translate.call_item(call.id, name or "", "",
                                                             "in_progress"))
            if call.function is not None and call.function.arguments:
                self.text += call.function.arguments
                out.append(self.event("response.function_call_arguments.delta", **self.at,
                                      delta=call.function.arguments))
        return out


async def events(request: Request[Any, Any, Any], run: ChatRun, body: ResponsesRequest,
                 created: int, shutdown: anyio.Event) -> AsyncIterator[ServerSentEvent]:
    items, finish = Items(run.id), None
    start = translate.response(run.id, created, run.model, body, [], None, None)
    yield items.event("response.created", response=start)
    yield items.event("response.in_progress", response=start)
    async for item in deltas(request, run, shutdown):
        if isinstance(item, APIError):
            yield items.event("error", code=item.code, message=item.message, param=item.param)
            return
        if isinstance(item, FinalEvent):
            for e in items.close():
                yield e
            if not items.items:  # nothing written: still one (empty) message
                for e in items.need("message") + items.close():
                    yield e
            u = item.usage
            info = UsageInfo(u.prompt_tokens, u.completion_tokens,
                             u.prompt_tokens + u.completion_tokens,
                             PromptTokensDetails(u.cached_tokens))
            done = translate.response(run.id, created, run.model, body, items.items,
                                      finish or "stop", info)
            kind = "response.incomplete" if done["status"] == "incomplete" else \
                "response.completed"
            yield items.event(kind, response=done)
            return
        finish = item.finish_reason or finish
        for e in items.render(item):
            yield e

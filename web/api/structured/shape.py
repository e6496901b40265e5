"""Chat choices and stream chunks when the reply may hold tool calls.

Whole replies carry `message.tool_calls` (ids `call_...`) and `finish_reason: "tool_calls"`;
streams send content deltas as usual and each call as OpenAI does: a first delta with the
call's index, id, type and name (arguments ""), then its arguments in fragments as the model
writes them (web/api/structured/parse.py); calls read whole go out in FRAGMENT-sized pieces.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from engine import FinalEvent, RequestHandle, TextDelta
from web.api.choices import ChatShape, ended
from web.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatDelta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
)
from web.api.structured.parse import (
    ArgsPiece,
    CallStart,
    ParsedCall,
    Piece,
    ToolStream,
    parse_reply,
)
from web.api.structured.tools import ToolPlan

FRAGMENT = 24  # characters of arguments per streamed delta


def call_id() -> str:
    return "call_" + secrets.token_urlsafe(18).replace("-", "x").replace("_", "y")[:24]


@dataclass
class ToolChatShape(ChatShape):
    plan: ToolPlan | None = None
    tokenizer: Any = None  # for formats whose markers are special tokens
    streams: dict[int, ToolStream] = field(default_factory=dict)
    raw: dict[int, Any] = field(default_factory=dict)  # index -> detokenizer keeping specials
    calls: dict[int, int] = field(default_factory=dict)  # index -> calls sent so far

    def _special(self) -> bool:
        return self.plan is not None and self.plan.format.special and \
            getattr(self.tokenizer, "hf", None) is not None

    def _clean(self, text: str) -> str:
        if not self._special():
            return text
        for token in self.tokenizer.hf.all_special_tokens:
            text = text.replace(token, "")
        return text

    def _stream(self, index: int) -> ToolStream:
        assert self.plan is not None
        if index not in self.streams:
            self.streams[index] = ToolStream(self.plan.format, self.plan.names)
        return self.streams[index]

    def choice(self, index: int, handle: RequestHandle, final: FinalEvent) -> ChatChoice:
        base = super().choice(index, handle, final)
        assert self.plan is not None
        text = handle.text
        if self._special():
            text = self.tokenizer.decode(handle.token_ids, skip_special_tokens=False)
        content, calls = parse_reply(text, self.plan.format, self.plan.names)
        if not calls:
            return base
        tool_calls = [ToolCall(call_id(), FunctionCall(c.name, c.arguments)) for c in calls]
        content = self._clean(content).strip()
        message = AssistantMessage("assistant", content or None,
                                   reasoning_content=handle.reasoning or None,
                                   tool_calls=tool_calls)
        return ChatChoice(index, message,
                          "tool_calls", base.logprobs, base.ferry_finish_reason)

    def _chunks(self, index: int, pieces: list[Piece]) -> list[ChatChunkChoice]:
        out = []
        for piece in pieces:
            if isinstance(piece, str):
                text = self._clean(piece)
                if text:
                    out.append(ChatChunkChoice(index, ChatDelta(content=text)))
            elif isinstance(piece, CallStart):
                out.append(self._head(index, piece.name))
            elif isinstance(piece, ArgsPiece):
                out.append(self._fragment(index, piece.text))
            else:
                out.extend(self._call_chunks(index, piece))
        return out

    def _head(self, index: int, name: str) -> ChatChunkChoice:
        """A call's first delta: its index, id, type and name."""
        n = self.calls.get(index, 0)
        self.calls[index] = n + 1
        head = ToolCallDelta(n, call_id(), "function", FunctionCallDelta(name, ""))
        return ChatChunkChoice(index, ChatDelta(tool_calls=[head]))

    def _fragment(self, index: int, arguments: str) -> ChatChunkChoice:
        """The next piece of the current call's arguments."""
        delta = ToolCallDelta(self.calls[index] - 1, function=FunctionCallDelta(
            arguments=arguments))
        return ChatChunkChoice(index, ChatDelta(tool_calls=[delta]))

    def _call_chunks(self, index: int, call: ParsedCall) -> list[ChatChunkChoice]:
        out = [self._head(index, call.name)]
        for i in range(0, len(call.arguments), FRAGMENT):
            out.append(self._fragment(index, call.arguments[i:i + FRAGMENT]))
        return out

    def deltas(self, index: int, event: TextDelta) -> list[ChatChunkChoice]:
        text = event.text
        if self._special():
            if index not in self.raw:
                self.raw[index] = self.tokenizer.detokenizer(skip_special_tokens=False)
            text = "".join(self.raw[index].push(t) for t in event.token_ids)
        out = self._chunks(index, self._stream(index).push(text))
        if event.reasoning:  # a thinking model's reasoning comes before its calls
            out.insert(0, ChatChunkChoice(index, ChatDelta(reasoning_content=event.reasoning)))
        if event.logprobs and self.top is not None:
            logprobs = self._logprobs(event.logprobs)
            if out:
                out[0].logprobs = logprobs
            else:
                out.append(ChatChunkChoice(index, ChatDelta(), logprobs=logprobs))
        return out

    def ends(self, index: int, final: FinalEvent) -> list[ChatChunkChoice]:
        tail = ""
        if self._special() and index in self.raw:
            tail = self.raw[index].flush()
        stream = self._stream(index)
        out = self._chunks(index, stream.push(tail) + stream.flush())
        end = ChatShape.end(index, final)
        if self.calls.get(index):
            end = ChatChunkChoice(index, ChatDelta(), finish_reason="tool_calls",
                                  ferry_finish_reason=ended(final)["ferry_finish_reason"])
        return out + [end]


def chat_choices(shape: ChatShape, index: int, event: TextDelta | FinalEvent
                 ) -> list[ChatChunkChoice]:
    """The stream choices one event gives, with or without tool calls."""
    if isinstance(shape, ToolChatShape):
        return shape.ends(index, event) if isinstance(event, FinalEvent) else \
            shape.deltas(index, event)
    return [shape.end(index, event)] if isinstance(event, FinalEvent) else \
        shape.deltas(index, event)

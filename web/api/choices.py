"""Choices and stream chunks of both OpenAI shapes, built from engine handles and events.

finish_reason speaks OpenAI's vocabulary: a cancelled request (client gone, DELETE, server
shutdown) reports "stop", as OpenAI has no word for it; Ferry's own reason rides beside it in
`ferry_finish_reason` ("stop", "length" or "cancelled").
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from engine import FinalEvent, RequestHandle, TextDelta, TokenLogprob
from web.api.logprobs import CompletionLogprobsBuilder, TokenTexts, chat_logprobs
from web.api.reasoning import delta_choices
from web.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatDelta,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    PromptTokensDetails,
    UsageInfo,
)

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def openai_finish(reason: str) -> str:
    return FINISH.get(reason, "stop")


class Ended(TypedDict):
    finish_reason: str
    ferry_finish_reason: str


def ended(final: FinalEvent) -> Ended:
    """How a choice ended, in both vocabularies (a choice's keyword arguments)."""
    return Ended(finish_reason=openai_finish(final.finish_reason),
                 ferry_finish_reason=final.finish_reason)


def usage_of(finals: Sequence[FinalEvent]) -> UsageInfo:
    """One prompt, every choice's completion tokens (as OpenAI counts n > 1)."""
    first = finals[0].usage
    completion = sum(f.usage.completion_tokens for f in finals)
    return UsageInfo(first.prompt_tokens, completion, first.prompt_tokens + completion,
                     PromptTokensDetails(first.cached_tokens))


def _join(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(a.tokens + b.tokens, a.token_logprobs + b.token_logprobs,
                              a.top_logprobs + b.top_logprobs, a.text_offset + b.text_offset)


@dataclass
class CompletionShape:
    """How one completions call renders: echo, logprobs, and the prompt it may echo."""

    prompt_ids: list[int]
    prompt_text: str
    echo: bool
    top: int | None  # logprobs asked for (None: no logprobs in the answer)
    texts: TokenTexts
    builders: dict[int, CompletionLogprobsBuilder] = field(default_factory=dict)
    echoed: set[int] = field(default_factory=set)

    def builder(self, index: int) -> CompletionLogprobsBuilder:
        if index not in self.builders:
            self.builders[index] = CompletionLogprobsBuilder(self.texts, self.top or 0)
        return self.builders[index]

    def _prompt_part(self, index: int,
                     scores: Sequence[TokenLogprob | None] | None) -> CompletionLogprobs | None:
        if self.top is None or scores is None:
            return None
        part = self.builder(index).build(self.prompt_ids, scores)
        self.builder(index).offset = len(self.prompt_text)  # output offsets follow the text
        return part

    def _output_part(self, index: int, ids: Sequence[int],
                     scores: Sequence[TokenLogprob]) -> CompletionLogprobs | None:
        if self.top is None:
            return None
        if self.echo:
            self.builder(index).offset = max(self.builder(index).offset, len(self.prompt_text))
        n = min(len(ids), len(scores))
        return self.builder(index).build(ids[:n], scores[:n])

    def choice(self, index: int, handle: RequestHandle, final: FinalEvent) -> CompletionChoice:
        logprobs = None
        if self.top is not None:  # the prompt's part first: offsets run on from it
            prompt = self._prompt_part(index, handle.prompt_logprobs) if self.echo else None
            out = self._output_part(index, handle.token_ids, handle.logprobs)
            assert out is not None
            logprobs = _join(prompt, out) if prompt is not None else out
        text = (self.prompt_text if self.echo else "") + handle.text
        return CompletionChoice(index, text, logprobs=logprobs, **ended(final))

    def deltas(self, index: int, event: TextDelta) -> list[CompletionChoice]:
        """The stream choices one text delta gives (the scored, echoed prompt comes first)."""
        out = []
        if self.echo and index not in self.echoed and event.prompt_logprobs is not None:
            self.echoed.add(index)
            out.append(CompletionChoice(index, self.prompt_text,
                                        logprobs=self._prompt_part(index, event.prompt_logprobs)))
        logprobs = self._output_part(index, event.token_ids, event.logprobs) \
            if event.token_ids else None
        if event.text or logprobs is not None:
            out.append(CompletionChoice(index, event.text, logprobs=logprobs))
        return out

    def echo_first(self, index: int) -> CompletionChoice | None:
        """With echo and no prompt logprobs to wait for, the prompt is the first chunk."""
        if not self.echo or self.top is not None:
            return None
        self.echoed.add(index)
        return CompletionChoice(index, self.prompt_text)

    def end(self, index: int, final: FinalEvent) -> CompletionChoice:
        return CompletionChoice(index, "", **ended(final))


@dataclass
class ChatShape:
    top: int | None  # top_logprobs when logprobs is true, else None
    texts: TokenTexts

    def _logprobs(self, scores: Sequence[TokenLogprob]) -> ChatLogprobs | None:
        if self.top is None:
            return None
        return ChatLogprobs(chat_logprobs(self.texts, scores, self.top))

    def choice(self, index: int, handle: RequestHandle, final: FinalEvent) -> ChatChoice:
        message = AssistantMessage("assistant", handle.text, handle.reasoning or None)
        return ChatChoice(index, message, logprobs=self._logprobs(handle.logprobs),
                          **ended(final))

    def deltas(self, index: int, event: TextDelta) -> list[ChatChunkChoice]:
        logprobs = self._logprobs(event.logprobs) if event.logprobs else None
        return delta_choices(index, event, logprobs)

    @staticmethod
    def end(index: int, final: FinalEvent) -> ChatChunkChoice:
        return ChatChunkChoice(index, ChatDelta(), **ended(final))

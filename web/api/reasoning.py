"""Thinking models and template-less models in the chat API.

A thinking model's reasoning comes back as `reasoning_content` (as vLLM and llama.cpp's
server return it): on the message, or streamed as deltas of its own before the answer's.
`chat_template_kwargs: {"enable_thinking": false}` (vLLM's field) reaches the templates that
take it. Assistant messages sent back with their `reasoning_content` are accepted, and the
reasoning is not put in the prompt (the templates of Qwen3 and the R1 distills drop it too).
A model without a chat template chats through the tokenizer's plain fallback and its stop
strings.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from engine import SamplingParams, TextDelta, Tokenizer
from web.api.errors import APIError, unsupported
from web.api.schemas import ChatChunkChoice, ChatCompletionRequest, ChatDelta, ChatLogprobs

TEMPLATE_KWARGS = ("enable_thinking",)


def enable_thinking(body: ChatCompletionRequest) -> bool | None:
    """The request's `chat_template_kwargs.enable_thinking` (None: the server's default)."""
    kwargs = body.chat_template_kwargs or {}
    for name in kwargs:
        if name not in TEMPLATE_KWARGS:
            raise unsupported(f"chat_template_kwargs.{name}", f"the template argument {name!r}")
    value = kwargs.get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise APIError("chat_template_kwargs.enable_thinking must be true or false",
                       param="chat_template_kwargs.enable_thinking")
    return value


def with_chat_stops(params: list[SamplingParams], tokenizer: Tokenizer) -> list[SamplingParams]:
    """Every choice also stops where the template needs it to (the fallback's "User:")."""
    stops = tuple(s for s in tokenizer.chat_stops if s not in params[0].stop) if params else ()
    if not stops:
        return params
    return [dataclasses.replace(p, stop=p.stop + stops) for p in params]


def delta_choices(index: int, event: TextDelta,
                  logprobs: ChatLogprobs | None) -> list[ChatChunkChoice]:
    """The reasoning's delta, then the answer's (one TextDelta may end the reasoning and
    start the answer); the tokens' logprobs ride on the last of them."""
    deltas: Sequence[ChatDelta] = [d for d in (
        ChatDelta(reasoning_content=event.reasoning) if event.reasoning else None,
        ChatDelta(content=event.text) if event.text else None) if d is not None]
    if not deltas:
        return [] if logprobs is None else [ChatChunkChoice(index, ChatDelta(content=""),
                                                            logprobs=logprobs)]
    out = [ChatChunkChoice(index, d) for d in deltas]
    out[-1].logprobs = logprobs
    return out

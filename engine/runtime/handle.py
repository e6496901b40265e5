"""The consumer side of one request: events from the scheduler thread, text for the caller.

Detokenizing, splitting a thinking model's reasoning from its answer, and stop-string
matching happen here, off the scheduler thread (docs/architecture.md). Stop strings match the
answer, not the reasoning: a stop string in the model's thoughts would end it before it answers.
"""
from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.runtime.events import FinalEvent, TokenEvent
from engine.scheduling.request import TokenLogprob
from engine.text.reasoning import Reasoning
from engine.text.stops import StopMatcher

if TYPE_CHECKING:
    from engine.execution.text.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # of token_ids, when the request asked
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # once, when asked
    emitted: float | None = None  # time.perf_counter() the engine emitted the tokens
    reasoning: str = ""  # a thinking model's reasoning (before `text`, which is its answer)


Event = TextDelta | FinalEvent


class RequestHandle:
    def __init__(self, request_id: str, owner: str, prompt_ids: list[int],
                 tokenizer: Tokenizer | None, stop: tuple[str, ...],
                 cancel: Callable[[str, str], bool],
                 reasoning: Reasoning | None = None) -> None:
        self.id = request_id
        self.owner = owner
        self.prompt_tokens = len(prompt_ids)
        self.created = time.time()
        self.text = ""  # everything emitted so far (for reattaching streams)
        self.reasoning = ""  # the reasoning so far, when the request splits it out
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []  # one per output token, when asked
        self.prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        self.final: FinalEvent | None = None
        self._cancel = cancel
        self._detok = tokenizer.detokenizer(prompt_ids) if tokenizer is not None else None
        self._split = reasoning.splitter() if reasoning is not None else None
        if stop:
            self._stop: StopMatcher | None = StopMatcher(stop)
        else:
            self._stop = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._aqueue: asyncio.Queue[object] | None = asyncio.Queue() if self._loop else None
        self._squeue: queue.SimpleQueue[object] = queue.SimpleQueue()

    # -- producer side (scheduler thread) ------------------------------------------------
    def put(self, event: TokenEvent | FinalEvent) -> None:
        if self._loop is not None and self._aqueue is not None:
            with contextlib.suppress(RuntimeError):  # the consumer's loop is gone: nobody listens
                self._loop.call_soon_threadsafe(self._aqueue.put_nowait, event)
        else:
            self._squeue.put(event)

    # -- consumer side -------------------------------------------------------------------
    def cancel(self) -> bool:
        return self._cancel(self.id, "cancelled")

    def _text(self, text: str, final: bool) -> tuple[str, str]:
        """Detokenized text -> (reasoning, answer), the answer through the stop strings."""
        reasoning = ""
        if self._split is not None:
            reasoning, text = self._split.push(text)
            if final:
                more, tail = self._split.flush()
                reasoning, text = reasoning + more, text + tail
        if self._stop is not None:
            text, hit = self._stop.push(text)
            if final:
                text += self._stop.flush()
            elif hit:
                self._cancel(self.id, "stop")
        self.reasoning += reasoning
        self.text += text
        return reasoning, text

    def _translate(self, event: object) -> Event | None:
        if isinstance(event, FinalEvent):
            tail = self._detok.flush() if self._detok is not None and not self._stopped else ""
            reasoning, tail = self._text(tail, final=True) if not self._stopped else ("", "")
            if self._stopped and event.finish_reason not in ("stop", "error"):
                event = replace(event, finish_reason="stop")  # a stop string ended it
            if self._stopped:  # the reply ends with the token that completed the stop string
                event = replace(event, usage=replace(event.usage,
                                                     completion_tokens=len(self.token_ids)))
            self.final = event
            return event if not (tail or reasoning) else TextDelta(tail, (), reasoning=reasoning)
        assert isinstance(event, TokenEvent)
        if self._stopped:
            return None  # generated after the stop string, before the cancel landed
        if event.prompt_logprobs is not None:
            self.prompt_logprobs = event.prompt_logprobs
        # one token at a time, as plain decoding sends them: a stop string ends the reply
        # at the token that completes it, and the rest of a speculative run is dropped
        ids, texts, reasonings = event.token_ids, [], []
        for n, token in enumerate(event.token_ids, 1):
            reasoning, text = self._text(self._detok.push(token) if self._detok else "", False)
            texts.append(text)
            reasonings.append(reasoning)
            if self._stopped:
                ids = event.token_ids[:n]
                break
        lps = event.logprobs[:len(ids)]
        self.token_ids.extend(ids)
        self.logprobs.extend(lps)
        return TextDelta("".join(texts), ids, lps, event.prompt_logprobs, event.emitted,
                         "".join(reasonings))

    @property
    def _stopped(self) -> bool:
        return self._stop is not None and self._stop.stopped

    def _drain(self, event: object) -> Iterator[Event]:
        out = self._translate(event)
        if isinstance(out, TextDelta) and self.final is not None:
            yield out  # the tail text, then the final event itself
            yield self.final
        elif out is not None:
            yield out

    async def __aiter__(self) -> AsyncIterator[Event]:
        assert self._aqueue is not None, "iterate with events() outside an event loop"
        while self.final is None:
            for out in self._drain(await self._aqueue.get()):
                yield out

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Blocking iteration, for handles made outside an event loop (bench, tests)."""
        while self.final is None:
            yield from self._drain(self._squeue.get(timeout=timeout))

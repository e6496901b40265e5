"""The consumer side of one gateway request: the same surface as engine.RequestHandle
(text deltas, then one FinalEvent), fed by the gateway task from the upstream's stream."""
from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator

from engine import FinalEvent, TextDelta, TokenLogprob

Event = TextDelta | FinalEvent


class GatewayHandle:
    def __init__(self, request_id: str, owner: str, prompt_tokens: int,
                 cancel: Callable[[str, str], bool]) -> None:
        self.id = request_id
        self.owner = owner
        self.prompt_tokens = prompt_tokens  # an estimate until the upstream's usage arrives
        self.created = time.time()
        self.text = ""
        self.reasoning = ""  # the upstream's reasoning_content, as it came
        self.token_ids: list[int] = []  # upstreams send text; ids stay empty
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        self.final: FinalEvent | None = None
        self._cancel = cancel
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._aqueue: asyncio.Queue[Event] | None = asyncio.Queue() if self._loop else None
        self._squeue: queue.SimpleQueue[Event] = queue.SimpleQueue()

    # -- producer side (the gateway task) ------------------------------------------------
    def put(self, event: Event) -> None:
        if self._loop is not None and self._aqueue is not None:
            if self._on_loop():
                self._aqueue.put_nowait(event)  # the usual case: no hop, no wake-up write
                return
            # RuntimeError: the consumer's loop is gone
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._aqueue.put_nowait, event)
        else:
            self._squeue.put(event)

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    # -- consumer side -------------------------------------------------------------------
    def cancel(self) -> bool:
        return self._cancel(self.id, "cancelled")

    def _take(self, event: Event) -> Event:
        if isinstance(event, FinalEvent):
            self.final = event
        else:
            self.text += event.text
            self.reasoning += event.reasoning
        return event

    async def __aiter__(self) -> AsyncIterator[Event]:
        assert self._aqueue is not None, "iterate with events() outside an event loop"
        while self.final is None:
            yield self._take(await self._aqueue.get())

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        while self.final is None:
            yield self._take(self._squeue.get(timeout=timeout))

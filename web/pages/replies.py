"""Chat replies that outlive their HTTP connections.

A Reply consumes one engine request, saves its text as it grows (at most every
`flush_interval` seconds, and at the end) and fans the deltas out to any number of SSE
listeners. A page that reloads mid-reply subscribes again and gets the text so far, then
the rest. When the last listener leaves (tab closed, network gone) and nobody comes back
within `grace` seconds, the request is cancelled and the partial reply kept as incomplete.
"""
from __future__ import annotations

import asyncio
import logging
import time

from engine import FinalEvent, RequestHandle, TextDelta
from web.storage.store import Store

log = logging.getLogger(__name__)
Note = tuple[str, str]  # ("token", text) | ("final", status)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a chat reply failed", exc_info=task.exception())


class Reply:
    def __init__(self, replies: Replies, handle: RequestHandle, message_id: int,
                 conversation_id: int) -> None:
        self.handle = handle
        self.message_id = message_id
        self.conversation_id = conversation_id
        self.status = "streaming"
        self.final: FinalEvent | None = None
        self._replies = replies
        self._listeners: set[asyncio.Queue[Note]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(_log_failure)
        self._arm()

    @property
    def text(self) -> str:
        return self.handle.text

    @property
    def done(self) -> bool:
        return self.status != "streaming"

    # -- listeners ---------------------------------------------------------------------
    def subscribe(self) -> tuple[str, asyncio.Queue[Note]]:
        """The text so far and a queue of what follows (atomic: one event loop)."""
        queue: asyncio.Queue[Note] = asyncio.Queue()
        self._listeners.add(queue)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return self.text, queue

    def unsubscribe(self, queue: asyncio.Queue[Note]) -> None:
        self._listeners.discard(queue)
        if not self._listeners and not self.done:
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        grace = self._replies.grace
        self._timer = asyncio.get_running_loop().call_later(grace, self._orphaned)

    def _orphaned(self) -> None:
        self._timer = None
        if not self._listeners and not self.done:
            log.info("reply %s has no listener: cancelling %s", self.message_id, self.handle.id)
            self.handle.cancel()

    def _tell(self, note: Note) -> None:
        for queue in self._listeners:
            queue.put_nowait(note)

    # -- the request -------------------------------------------------------------------
    async def _run(self) -> None:
        store, interval = self._replies.store, self._replies.flush_interval
        last_save = time.monotonic()
        try:
            async for event in self.handle:
                if isinstance(event, TextDelta):
                    if event.text:
                        self._tell(("token", event.text))
                        if time.monotonic() - last_save >= interval:
                            store.save_partial(self.message_id, self.text)
                            last_save = time.monotonic()
                else:
                    self.final = event
        except BaseException:  # cancelled (shutdown) or failed: stop the engine's work too
            if self.final is None:
                self.handle.cancel()
            raise
        finally:
            self._finish()

    def _finish(self) -> None:
        final = self.final
        complete = (final is not None and final.error is None
                    and final.finish_reason in ("stop", "length"))
        self.status = "complete" if complete else "incomplete"
        reason = final.finish_reason if final is not None else "cancelled"
        error = final.error if final is not None else None
        try:
            self._replies.store.finish_message(self.message_id, self.text, self.status, reason,
                                               error)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._tell(("final", self.status))
            self._replies.forget(self)


class Replies:
    def __init__(self, store: Store, grace: float = 3.0, flush_interval: float = 0.5) -> None:
        self.store = store
        self.grace = grace
        self.flush_interval = flush_interval
        self._live: dict[int, Reply] = {}  # message id -> reply

    def start(self, handle: RequestHandle, message_id: int, conversation_id: int) -> Reply:
        reply = Reply(self, handle, message_id, conversation_id)
        self._live[message_id] = reply  # before its task first runs: forget() comes later
        return reply

    def get(self, message_id: int) -> Reply | None:
        return self._live.get(message_id)

    def in_conversation(self, conversation_id: int) -> list[Reply]:
        return [r for r in self._live.values() if r.conversation_id == conversation_id]

    def forget(self, reply: Reply) -> None:
        self._live.pop(reply.message_id, None)

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel every live reply and wait until each has saved its text."""
        replies = list(self._live.values())
        for reply in replies:
            reply.handle.cancel()
        tasks = [r.task for r in replies]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

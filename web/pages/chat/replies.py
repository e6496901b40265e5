"""Chat replies that belong to their conversation, not to the open tab.

A Reply consumes one engine request, saves its text as it grows (at most every
`flush_interval` seconds, and at the end) and fans the deltas out to any number of SSE
listeners. Leaving the page (another conversation, the dashboard, a closed tab) never cancels
it: it runs to its end unless its owner presses Stop, an admin cancels it, or the server
shuts down. A page that comes back subscribes again and gets the text so far, then the rest;
`reply_events` is that stream. A thinking model's reasoning is kept and streamed apart from
its answer (the page shows it in a collapsed "Thinking" block).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from litestar.connection import ASGIConnection
from sse_starlette import ServerSentEvent

from engine import FinalEvent, RequestHandle, TextDelta
from web.access.disclosure import final_error
from web.access.identity import User
from web.pages.chat import reply_status
from web.pages.chat.rules import version_nav
from web.pages.rendered import render_ahead
from web.sse import done_event, html_event, on_event, text_event
from web.storage.store import Conversation, Store

if TYPE_CHECKING:
    from web.services import Services
    from web.tracker import RequestTracker

log = logging.getLogger(__name__)
Note = tuple[str, str]  # ("token", text) | ("reasoning", text) | ("final", status)
STATUS_POLL = 0.25  # seconds between looks at the engine snapshot while a reply waits


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a chat reply failed", exc_info=task.exception())


class Reply:
    def __init__(self, replies: Replies, handle: RequestHandle, message_id: int,
                 conversation_id: int, max_tokens: int | None = None, prefix: str = "",
                 earlier_tokens: int = 0, reasoning_prefix: str = "",
                 user: User | None = None) -> None:
        self.handle = handle
        self.user = user  # whom its error is worded for (None: as the engine said it)
        self.message_id = message_id
        self.conversation_id = conversation_id
        self.max_tokens = max_tokens
        self.prefix = prefix  # text before this request (Continue appends to a reply)
        self.earlier_tokens = earlier_tokens
        self.reasoning_prefix = reasoning_prefix
        self.status = "streaming"
        self.final: FinalEvent | None = None
        self.stopped_by_owner = False
        self.shut_down = False
        self._replies = replies
        self._listeners: set[asyncio.Queue[Note]] = set()
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(_log_failure)

    @property
    def text(self) -> str:
        return self.prefix + self.handle.text

    @property
    def reasoning(self) -> str:
        return self.reasoning_prefix + self.handle.reasoning

    @property
    def done(self) -> bool:
        return self.status != "streaming"

    def stop(self) -> bool:
        """The owner's Stop."""
        self.stopped_by_owner = True
        return self.handle.cancel()

    # -- listeners ---------------------------------------------------------------------
    def subscribe(self) -> tuple[str, asyncio.Queue[Note]]:
        """The text so far and a queue of what follows (atomic: one event loop)."""
        queue: asyncio.Queue[Note] = asyncio.Queue()
        self._listeners.add(queue)
        return self.text, queue

    def unsubscribe(self, queue: asyncio.Queue[Note]) -> None:
        self._listeners.discard(queue)  # the reply goes on: it belongs to the conversation

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
                    if event.reasoning:
                        self._tell(("reasoning", event.reasoning))
                    if event.text:
                        self._tell(("token", event.text))
                    if (event.text or event.reasoning) and \
                            time.monotonic() - last_save >= interval:
                        store.save_partial(self.message_id, self.text, self.reasoning)
                        last_save = time.monotonic()
                else:
                    self.final = event
        except BaseException:  # cancelled (shutdown) or failed: stop the engine's work too
            if self.final is None:
                self.shut_down = True
                self.handle.cancel()
            raise
        finally:
            self._finish()

    def _canceller(self) -> str | None:
        """Who cancelled the request, when someone else did (the dashboard says so)."""
        tracker = self._replies.tracker
        item = tracker.get(self.handle.id) if tracker is not None else None
        who = getattr(item, "cancelled_by", None)
        if who is None and self.final is not None:
            who = self.final.extra.get("cancelled_by")
        return str(who) if who else None

    def _finish(self) -> None:
        final = self.final
        complete = (final is not None and final.error is None
                    and final.finish_reason in ("stop", "length"))
        self.status = "complete" if complete else "incomplete"
        reason = final.finish_reason if final is not None else "cancelled"
        if final is not None and final.error is not None and self.user is not None:
            # a normal user's words: the model that failed to load, never a path
            final = dataclasses.replace(final, error=final_error(final, self.user)[0])
        error = final.error if final is not None else None
        ended = reply_status.ended_words(final, self.max_tokens, self.stopped_by_owner,
                                         self.shut_down, None if complete else self._canceller())
        try:
            self._replies.store.finish_message(
                self.message_id, self.text, self.status, reason, error, ended,
                reply_status.figures(final, self.earlier_tokens), self.reasoning)
        finally:
            self._tell(("final", self.status))
            self._replies.forget(self)


class Replies:
    def __init__(self, store: Store, flush_interval: float = 0.5,
                 tracker: RequestTracker | None = None) -> None:
        self.store = store
        self.flush_interval = flush_interval
        self.tracker = tracker
        self._live: dict[int, Reply] = {}  # message id -> reply

    def start(self, handle: RequestHandle, message_id: int, conversation_id: int,
              max_tokens: int | None = None, prefix: str = "",
              earlier_tokens: int = 0, reasoning_prefix: str = "",
              user: User | None = None) -> Reply:
        reply = Reply(self, handle, message_id, conversation_id, max_tokens, prefix,
                      earlier_tokens, reasoning_prefix, user)
        self._live[message_id] = reply  # before its task first runs: forget() comes later
        return reply

    def get(self, message_id: int) -> Reply | None:
        return self._live.get(message_id)

    def in_conversation(self, conversation_id: int) -> list[Reply]:
        return [r for r in self._live.values() if r.conversation_id == conversation_id]

    def live_conversations(self) -> set[int]:
        """Conversations with a reply in progress (the sidebar marks them)."""
        return {r.conversation_id for r in self._live.values()}

    def forget(self, reply: Reply) -> None:
        self._live.pop(reply.message_id, None)

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel every live reply and wait until each has saved its text."""
        replies = list(self._live.values())
        for reply in replies:
            reply.shut_down = True
            reply.handle.cancel()
        tasks = [r.task for r in replies]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)


async def reply_events(s: Services, replies: Replies, conv: Conversation, message_id: int,
                       shutdown: anyio.Event) -> AsyncIterator[ServerSentEvent]:
    """Where the reply stands while it waits (`status`), the text so far, each new delta,
    then the finished message (rendered Markdown, `final`) and `done`.

    Idempotent: a finished reply gets its final form and `done` at once. Leaving (the
    generator is cancelled) changes nothing for the reply. On server shutdown the stream
    just ends: the page reconnects when the server is back and gets the reply as saved.
    """
    reply = replies.get(message_id)
    if reply is not None and not reply.done:
        thought = reply.reasoning  # with the text so far: nothing can come in between
        text, queue = reply.subscribe()
        watcher = on_event(shutdown, lambda: queue.put_nowait(("shutdown", "")))
        said: str | None = None
        try:
            if thought:
                yield text_event("reasoning", thought)
            if text:
                yield text_event("token", text)
            while True:
                if not reply.handle.text and not reply.handle.reasoning:  # say where it stands
                    now = reply_status.standing(s.engine.snapshot(), reply.handle.id)
                    if now is not None and now != said:
                        said = now
                        yield text_event("status", now)
                try:
                    kind, payload = await asyncio.wait_for(queue.get(), STATUS_POLL)
                except TimeoutError:
                    continue
                if kind == "shutdown":
                    return
                if kind not in ("token", "reasoning"):
                    break
                yield text_event(kind, payload)
        finally:
            watcher.cancel()
            reply.unsubscribe(queue)
    msg = s.store.message(message_id)
    if msg is not None:
        await render_ahead((msg.content, msg.reasoning))
        yield html_event("final", s.render("_messages.html", messages=[msg], conversation=conv,
                                           versions=version_nav(s.store, [msg])))
    yield done_event()


def replies(connection: ASGIConnection[Any, Any, Any, Any]) -> Replies:
    """The chat's live replies, kept on `app.state.replies` by create_app (the chat owns them,
    not the shared Services)."""
    return connection.app.state.replies  # type: ignore[no-any-return]

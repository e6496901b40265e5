"""The chat store: WAL mode, and a reply's text survives a crash mid-stream."""
from __future__ import annotations

import asyncio
from pathlib import Path

from engine.runtime.events import FinalEvent, Timings, Usage
from engine.runtime.handle import TextDelta
from web.pages.replies import Replies
from web.storage.store import Store


def test_wal_mode_and_ownership(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    assert store.journal_mode == "wal"
    a = store.create_conversation("alice", "Hello")
    store.create_conversation("bob", "Other")
    store.add_message(a.id, "user", "hi")
    assert [c.title for c in store.conversations("alice")] == ["Hello"]
    assert [m.content for m in store.messages(a.id)] == ["hi"]
    store.delete_conversation(a.id)
    assert store.messages(a.id) == [] and store.conversation(a.id) is None
    store.close()


def test_streaming_reply_left_by_a_crash_is_kept_incomplete(tmp_path: Path) -> None:
    path = tmp_path / "ferry.sqlite3"
    store = Store(path)
    conv = store.create_conversation("local", "t")
    msg = store.add_message(conv.id, "assistant", "", "streaming", "req-1")
    store.save_partial(msg.id, "Once upon a")
    # no finish_message: the process died; a new one opens the same file
    again = Store(path)
    kept = again.message(msg.id)
    assert kept is not None and kept.content == "Once upon a" and kept.status == "incomplete"
    store.close()
    again.close()


class FakeHandle:
    """Stands in for engine.runtime.handle.RequestHandle: deltas at a steady pace, then a final."""

    def __init__(self, words: list[str], gap: float) -> None:
        self.id = "req-fake"
        self.words = words
        self.gap = gap
        self.text = ""
        self.final: FinalEvent | None = None
        self.cancelled = asyncio.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True

    async def __aiter__(self):
        reason = "stop"
        for word in self.words:
            try:
                await asyncio.wait_for(self.cancelled.wait(), self.gap)
                reason = "cancelled"
                break
            except TimeoutError:
                pass
            self.text += word
            yield TextDelta(word, (1,))
        self.final = FinalEvent(reason, Usage(3, len(self.text.split())),  # type: ignore[arg-type]
                                Timings(0, 0, 0, 0))
        yield self.final


def test_reply_is_saved_while_it_streams(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    conv = store.create_conversation("local", "t")
    msg = store.add_message(conv.id, "assistant", "", "streaming")

    async def run() -> None:
        replies = Replies(store, grace=30, flush_interval=0.1)
        handle = FakeHandle([f"w{i} " for i in range(40)], 0.02)
        reply = replies.start(handle, msg.id, conv.id)  # type: ignore[arg-type]
        _, queue = reply.subscribe()
        await asyncio.sleep(0.4)
        partial = store.message(msg.id)
        assert partial is not None and partial.status == "streaming"
        assert partial.content.startswith("w0 w1 ") and len(partial.content) < len(
            "".join(handle.words))
        while (await queue.get())[0] != "final":
            pass
        await reply.task

    asyncio.run(run())
    done = store.message(msg.id)
    assert done is not None and done.status == "complete" and done.content.endswith("w39 ")
    store.close()


def test_reply_nobody_listens_to_is_cancelled_and_kept_incomplete(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    conv = store.create_conversation("local", "t")
    msg = store.add_message(conv.id, "assistant", "", "streaming")

    async def run() -> FakeHandle:
        replies = Replies(store, grace=0.15, flush_interval=0.1)
        handle = FakeHandle([f"w{i} " for i in range(200)], 0.01)
        reply = replies.start(handle, msg.id, conv.id)  # type: ignore[arg-type]
        _, queue = reply.subscribe()
        await asyncio.sleep(0.1)
        reply.unsubscribe(queue)  # the page went away and does not come back
        await asyncio.wait_for(reply.task, 5)
        assert replies.get(msg.id) is None
        return handle

    handle = asyncio.run(run())
    assert handle.cancelled.is_set()
    kept = store.message(msg.id)
    assert kept is not None and kept.status == "incomplete" and kept.content
    assert kept.finish_reason == "cancelled"
    store.close()

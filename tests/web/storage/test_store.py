"""The chat store: WAL mode, a reply's text survives a crash mid-stream, older databases are
migrated in place, search, versions; replies run to their end with nobody listening."""
from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.runtime.events import FinalEvent, Timings, Usage
from engine.runtime.handle import TextDelta
from web.pages.chat.replies import Note, Replies, Reply
from web.storage.store import RESTARTED, SCHEMA_VERSION, Conversation, Message, ReplyFigures, Store


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
    assert kept.ended == RESTARTED
    store.close()
    again.close()


class FakeHandle:
    """Stands in for engine.runtime.handle.RequestHandle: deltas at a steady pace, then a final."""

    def __init__(self, words: list[str], gap: float) -> None:
        self.id = "req-fake"
        self.words = words
        self.gap = gap
        self.text = ""
        self.reasoning = ""
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


@pytest.fixture
def streaming(tmp_path: Path) -> Iterator[tuple[Store, Conversation, Message]]:
    """A store with one conversation and its streaming assistant message (closed after)."""
    store = Store(tmp_path / "ferry.sqlite3")
    conv = store.create_conversation("local", "t")
    yield store, conv, store.add_message(conv.id, "assistant", "", "streaming")
    store.close()


def start(streaming: tuple[Store, Conversation, Message], words: int,
          gap: float) -> tuple[Replies, FakeHandle, Reply]:
    """Replies (a flush every 0.1 s) streaming `words` words into the message, `gap` s apart."""
    store, conv, msg = streaming
    replies = Replies(store, flush_interval=0.1)
    handle = FakeHandle([f"w{i} " for i in range(words)], gap)
    return replies, handle, replies.start(handle, msg.id, conv.id)  # type: ignore[arg-type]


async def listen(streaming: tuple[Store, Conversation, Message], words: int, gap: float,
                 wait: float) -> tuple[Replies, FakeHandle, Reply, asyncio.Queue[Note]]:
    """start() with a page subscribed to the reply; returns `wait` s later, midway through it."""
    replies, handle, reply = start(streaming, words, gap)
    _, queue = reply.subscribe()
    await asyncio.sleep(wait)
    return replies, handle, reply, queue


def test_reply_is_saved_while_it_streams(
        streaming: tuple[Store, Conversation, Message]) -> None:
    store, _, msg = streaming

    async def run() -> None:
        _, handle, reply, queue = await listen(streaming, 40, 0.02, wait=0.4)
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


def test_reply_nobody_listens_to_runs_to_its_end(
        streaming: tuple[Store, Conversation, Message]) -> None:
    store, conv, msg = streaming

    async def run() -> FakeHandle:
        replies, handle, reply, queue = await listen(streaming, 60, 0.01, wait=0.1)
        reply.unsubscribe(queue)  # the page went away (the dashboard, another chat, closed)
        assert replies.live_conversations() == {conv.id}
        await asyncio.wait_for(reply.task, 5)
        assert replies.get(msg.id) is None and replies.live_conversations() == set()
        return handle

    handle = asyncio.run(run())
    assert not handle.cancelled.is_set()
    kept = store.message(msg.id)
    assert kept is not None and kept.status == "complete" and kept.content.endswith("w59 ")
    assert kept.finish_reason == "stop" and kept.ended is None


def test_stop_by_the_owner_says_so(streaming: tuple[Store, Conversation, Message]) -> None:
    store, _, msg = streaming

    async def run() -> None:
        _, _, reply = start(streaming, 200, 0.01)
        await asyncio.sleep(0.1)
        assert reply.stop()
        await asyncio.wait_for(reply.task, 5)

    asyncio.run(run())
    kept = store.message(msg.id)
    assert kept is not None and kept.status == "incomplete" and kept.ended == "stopped by you"
    assert kept.finish_reason == "cancelled" and kept.completion_tokens is not None


OLD_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX conversations_owner ON conversations (owner, updated);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role TEXT NOT NULL, content TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'complete',
    finish_reason TEXT, error TEXT, request_id TEXT, created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX messages_conversation ON messages (conversation_id, id);
INSERT INTO conversations VALUES (1, 'alice', 'Old chat', 1.0, 2.0);
INSERT INTO messages VALUES (1, 1, 'user', 'hi', 'complete', NULL, NULL, NULL, 1.0, 1.0);
INSERT INTO messages VALUES (2, 1, 'assistant', 'Hello!', 'complete', 'stop', NULL, 'req-1',
    1.5, 1.5);
INSERT INTO messages VALUES (3, 1, 'assistant', 'Half a', 'streaming', NULL, NULL, 'req-2',
    1.6, 1.6);
"""


def test_a_database_of_the_first_schema_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "ferry.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION
    conv = store.conversation(1)
    assert conv is not None and conv.title == "Old chat" and conv.owner == "alice"
    assert conv.system_prompt is None and conv.temperature is None and conv.max_tokens is None
    user, reply, cut = store.messages(1)
    assert (user.content, reply.content, reply.finish_reason) == ("hi", "Hello!", "stop")
    assert reply.hidden == 0 and reply.group == reply.id and reply.ttft is None
    assert cut.status == "incomplete" and cut.ended == RESTARTED and cut.content == "Half a"
    # the new columns work on the old rows, and opening again changes nothing
    store.set_settings(1, "Be brief.", 0.2, 0.9, 64)
    store.finish_message(2, "Hello!", "complete", "stop",
                         figures=ReplyFigures(10, 3, 0.25, 12.5))
    store.close()
    again = Store(path)
    conv = again.conversation(1)
    assert conv is not None and (conv.system_prompt, conv.temperature, conv.max_tokens) == (
        "Be brief.", 0.2, 64)
    m = again.message(2)
    assert m is not None and (m.prompt_tokens, m.completion_tokens, m.ttft, m.tokens_per_s) == (
        10, 3, 0.25, 12.5)
    again.close()


V1_COLUMNS = {"conversations": ("system_prompt TEXT", "temperature REAL", "top_p REAL",
                                 "max_tokens INTEGER"),
              "messages": ("prompt_tokens INTEGER", "completion_tokens INTEGER", "ttft REAL",
                           "tokens_per_s REAL", "max_tokens INTEGER", "ended TEXT", "note TEXT",
                           "version_group INTEGER", "hidden INTEGER NOT NULL DEFAULT 0")}


def test_a_version_1_database_gains_reasoning_and_the_thinking_setting(tmp_path: Path) -> None:
    path = tmp_path / "ferry.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    for table, columns in V1_COLUMNS.items():
        for column in columns:
            old.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    old.execute("PRAGMA user_version = 1")
    old.commit()
    old.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION == 4
    conv = store.conversation(1)
    assert conv is not None and conv.enable_thinking is None and conv.thinking
    reply = store.message(2)
    assert reply is not None and reply.reasoning is None and reply.content == "Hello!"
    store.set_settings(1, None, None, None, None, enable_thinking=False)
    store.finish_message(2, "Hello!", "complete", "stop", reasoning="The user greets me.")
    store.save_partial(3, "Half a", "Half a thought")
    store.close()
    again = Store(path)
    conv = again.conversation(1)
    assert conv is not None and conv.enable_thinking == 0 and not conv.thinking
    assert [m.reasoning for m in again.messages(1)] == [None, "The user greets me.",
                                                        "Half a thought"]
    again.close()


def test_search_versions_rename_and_edit(tmp_path: Path) -> None:
    store = Store(tmp_path / "ferry.sqlite3")
    a = store.create_conversation("alice", "Cooking")
    b = store.create_conversation("alice", "Travel")
    store.create_conversation("bob", "Cooking for bob")
    store.add_message(a.id, "user", "how long to boil an egg?")
    store.add_message(b.id, "user", "trains to 50%_off Lisbon")
    assert [c.id for c in store.conversations("alice", search="cook")] == [a.id]
    assert [c.id for c in store.conversations("alice", search="EGG")] == [a.id]
    assert [c.id for c in store.conversations("alice", search="50%_")] == [b.id]
    assert store.conversations("alice", search="b%l") == []  # LIKE wildcards are literal
    store.rename(a.id, "Eggs")
    assert store.conversation(a.id).title == "Eggs"  # type: ignore[union-attr]
    first = store.add_message(a.id, "assistant", "ten minutes")
    store.set_hidden(first.id, True)
    second = store.add_message(a.id, "assistant", "seven", version_group=first.group)
    assert [m.id for m in store.messages(a.id)][-1] == second.id
    assert [m.id for m in store.versions(first.group)] == [first.id, second.id]
    store.show_version(first)
    assert [m.content for m in store.messages(a.id)] == ["how long to boil an egg?",
                                                        "ten minutes"]
    assert len(store.messages(a.id, hidden=True)) == 3
    store.delete_after(a.id, store.messages(a.id)[0].id)
    assert [m.role for m in store.messages(a.id, hidden=True)] == ["user"]
    store.close()


def test_a_version_2_database_gains_the_conversation_and_reply_models(tmp_path: Path) -> None:
    path = tmp_path / "ferry.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    columns = {"conversations": (*V1_COLUMNS["conversations"], "enable_thinking INTEGER"),
               "messages": (*V1_COLUMNS["messages"], "reasoning TEXT")}
    for table, added in columns.items():
        for column in added:
            old.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    old.execute("PRAGMA user_version = 2")
    old.commit()
    old.close()
    store = Store(path)
    assert store.schema_version == SCHEMA_VERSION == 4
    conv = store.conversation(1)
    assert conv is not None and conv.model is None  # the server's default
    assert [m.model for m in store.messages(1)] == [None, None, None]
    store.set_model(1, "beta")
    reply = store.add_message(1, "assistant", "Hi", model="beta")
    store.close()
    again = Store(path)
    conv = again.conversation(1)
    assert conv is not None and conv.model == "beta"
    m = again.message(reply.id)
    assert m is not None and m.model == "beta"
    again.close()

"""Chat history in SQLite (WAL): conversations and their messages, each with an owner.

A reply is written while it streams (status `streaming`), so a crash keeps the text that
was generated; opening the store marks such leftovers `incomplete`. A finished reply is
`complete`, or `incomplete` when Stop, a disconnect, shutdown or an error cut it short.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (owner, updated);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'complete',
    finish_reason TEXT,
    error TEXT,
    request_id TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_conversation ON messages (conversation_id, id);
"""


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    owner: str
    title: str
    created: float
    updated: float


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    conversation_id: int
    role: str  # user | assistant
    content: str
    status: str  # complete | streaming | incomplete
    finish_reason: str | None
    error: str | None
    request_id: str | None
    created: float

    @property
    def is_streaming(self) -> bool:
        return self.status == "streaming"


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        # replies that were streaming when the last process died keep their text
        self._db.execute("UPDATE messages SET status = 'incomplete' WHERE status = 'streaming'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    def _run(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    # -- conversations -----------------------------------------------------------------
    def create_conversation(self, owner: str, title: str) -> Conversation:
        now = time.time()
        cur = self._run("INSERT INTO conversations (owner, title, created, updated) "
                        "VALUES (?, ?, ?, ?)", (owner, title, now, now))
        return Conversation(int(cur.lastrowid or 0), owner, title, now, now)

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._run("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(**dict(row)) if row else None

    def conversations(self, owner: str, limit: int = 200) -> list[Conversation]:
        rows = self._run("SELECT * FROM conversations WHERE owner = ? "
                         "ORDER BY updated DESC, id DESC LIMIT ?", (owner, limit)).fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def delete_conversation(self, conversation_id: int) -> None:
        self._run("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def touch(self, conversation_id: int) -> None:
        self._run("UPDATE conversations SET updated = ? WHERE id = ?",
                  (time.time(), conversation_id))

    # -- messages ----------------------------------------------------------------------
    def add_message(self, conversation_id: int, role: str, content: str,
                    status: str = "complete", request_id: str | None = None) -> Message:
        now = time.time()
        cur = self._run("INSERT INTO messages (conversation_id, role, content, status, "
                        "request_id, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (conversation_id, role, content, status, request_id, now, now))
        self.touch(conversation_id)
        return Message(int(cur.lastrowid or 0), conversation_id, role, content, status, None,
                       None, request_id, now)

    def message(self, message_id: int) -> Message | None:
        row = self._run("SELECT id, conversation_id, role, content, status, finish_reason, "
                        "error, request_id, created FROM messages WHERE id = ?",
                        (message_id,)).fetchone()
        return Message(**dict(row)) if row else None

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._run("SELECT id, conversation_id, role, content, status, finish_reason, "
                         "error, request_id, created FROM messages WHERE conversation_id = ? "
                         "ORDER BY id", (conversation_id,)).fetchall()
        return [Message(**dict(r)) for r in rows]

    def save_partial(self, message_id: int, content: str) -> None:
        self._run("UPDATE messages SET content = ?, updated = ? WHERE id = ?",
                  (content, time.time(), message_id))

    def finish_message(self, message_id: int, content: str, status: str,
                       finish_reason: str | None, error: str | None = None) -> None:
        self._run("UPDATE messages SET content = ?, status = ?, finish_reason = ?, error = ?, "
                  "updated = ? WHERE id = ?",
                  (content, status, finish_reason, error, time.time(), message_id))

    def delete_message(self, message_id: int) -> None:
        self._run("DELETE FROM messages WHERE id = ?", (message_id,))

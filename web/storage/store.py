"""Chat history in SQLite (WAL): conversations and their messages, each with an owner.

A reply is written while it streams (status `streaming`), so a crash keeps the text that
was generated; opening the store marks such leftovers `incomplete` ("the server restarted").
A finished reply is `complete`, or `incomplete` when Stop, an admin's cancel, shutdown or an
error cut it short; `ended` says why in words. Regenerating keeps the earlier replies as
hidden versions of one `version_group`.

Schema versions (PRAGMA user_version): 0 the first release; 1 adds per-conversation
settings, reply figures (tokens, TTFT, tokens/s), `ended`, `note` and reply versions; 2 adds
a thinking model's `reasoning` beside each reply's content (it is shown collapsed and never
sent back to the model) and the conversation's `enable_thinking` (NULL: on); 3 adds the
conversation's `model` (NULL: the server's default) and the model that wrote each reply;
4 adds the `images` table: the pictures attached to a user's message (the file as sent, its
type, size and a small thumbnail), deleted with their message and so with the conversation.
Opening an older database adds the columns and the table in place (existing rows keep their
values).
"""
from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from web.storage.images import ImageTable, NewImage

SCHEMA_VERSION = 4
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
CREATE TABLE IF NOT EXISTS images (
    id INTEGER PRIMARY KEY,
    message_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    media_type TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    data BLOB NOT NULL,
    thumb BLOB NOT NULL,
    thumb_type TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS images_message ON images (message_id, position);
CREATE INDEX IF NOT EXISTS images_conversation ON images (conversation_id);
"""
# versions 1 to 3: the columns they add to each table, as ALTER TABLE ... ADD COLUMN takes
# them; NULL settings mean "the server's default"
ADDED_COLUMNS = {
    "conversations": ("system_prompt TEXT", "temperature REAL", "top_p REAL",
                      "max_tokens INTEGER", "enable_thinking INTEGER", "model TEXT"),
    "messages": ("prompt_tokens INTEGER", "completion_tokens INTEGER", "ttft REAL",
                 "tokens_per_s REAL", "max_tokens INTEGER", "ended TEXT", "note TEXT",
                 "version_group INTEGER", "hidden INTEGER NOT NULL DEFAULT 0",
                 "reasoning TEXT", "model TEXT"),
}
RESTARTED = "the server restarted"
MESSAGE_COLUMNS = ("id, conversation_id, role, content, status, finish_reason, error, "
                   "request_id, created, prompt_tokens, completion_tokens, ttft, tokens_per_s, "
                   "max_tokens, ended, note, version_group, hidden, reasoning, model")


@dataclass(frozen=True, slots=True)
class Conversation:
    id: int
    owner: str
    title: str
    created: float
    updated: float
    system_prompt: str | None = None  # None: the server's default
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    enable_thinking: int | None = None  # 0: off; None or 1: on (templates that take it)
    model: str | None = None  # the model it chats with (None: the server's default)

    @property
    def thinking(self) -> bool:
        return self.enable_thinking != 0


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
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None  # seconds to the first token
    tokens_per_s: float | None = None
    max_tokens: int | None = None  # the reply's token limit
    ended: str | None = None  # why it ended, in words ("stopped by you")
    note: str | None = None  # e.g. "the 4 oldest messages were left out to fit the context"
    version_group: int | None = None  # replies to the same question share one (None: own id)
    hidden: int = 0  # 1: an earlier version, not shown
    reasoning: str | None = None  # a thinking model's reasoning, apart from its answer
    model: str | None = None  # the model that wrote a reply (servers of several models)

    @property
    def is_streaming(self) -> bool:
        return self.status == "streaming"

    @property
    def group(self) -> int:
        return self.version_group if self.version_group is not None else self.id


@dataclass(frozen=True, slots=True)
class ReplyFigures:
    """What the engine reports when a reply ends."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft: float | None = None
    tokens_per_s: float | None = None


def migrate(db: sqlite3.Connection) -> None:
    """Bring a database of any earlier schema version to SCHEMA_VERSION (idempotent)."""
    db.executescript(SCHEMA)
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version >= SCHEMA_VERSION:
        return
    for table, columns in ADDED_COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column in columns:
            if column.split()[0] not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    db.execute("CREATE INDEX IF NOT EXISTS messages_group ON messages (version_group)")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


class Store(ImageTable):
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
        migrate(self._db)
        # replies that were streaming when the last process died keep their text
        self._db.execute("UPDATE messages SET status = 'incomplete', ended = ? "
                         "WHERE status = 'streaming'", (RESTARTED,))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    @property
    def schema_version(self) -> int:
        return int(self._run("PRAGMA user_version").fetchone()[0])

    def _run(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    # -- conversations -----------------------------------------------------------------
    def create_conversation(self, owner: str, title: str) -> Conversation:
        now = time.time()
        cur = self._run("INSERT INTO conversations (owner, title, created, updated) "
                        "VALUES (?, ?, ?, ?)", (owner, title, now, now))
        return Conversation(int(cur.lastrowid or 0), owner, title, now, now)

    def import_conversation(self, owner: str, title: str,
                            settings: tuple[str | None, float | None, float | None, int | None],
                            messages: list[tuple[str, str, str, str | None, str | None,
                                                 str | None]],
                            enable_thinking: bool | None = None,
                            model: str | None = None,
                            images: dict[int, list[NewImage]] | None = None) -> Conversation:
        """A whole conversation in one transaction (settings: system prompt, temperature,
        top_p, max_tokens; messages: role, content, status, finish_reason, reasoning, the
        model that wrote a reply; images: by the index of their message): if any row
        fails, nothing of it is kept."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO conversations (owner, title, created, updated, system_prompt, "
                    "temperature, top_p, max_tokens, enable_thinking, model) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (owner, title, now, now, *settings,
                     None if enable_thinking is None else int(enable_thinking), model))
                conversation_id = int(cur.lastrowid or 0)
                for i, (role, content, status, reason, reasoning, wrote) in \
                        enumerate(messages):
                    row = self._db.execute(
                        "INSERT INTO messages (conversation_id, role, content, status, "
                        "finish_reason, reasoning, model, created, updated) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (conversation_id, role, content, status, reason, reasoning, wrote,
                         now, now))
                    self._insert_images(conversation_id, int(row.lastrowid or 0),
                                        (images or {}).get(i, ()))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        found = self.conversation(conversation_id)
        assert found is not None
        return found

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._run("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(**dict(row)) if row else None

    def conversations(self, owner: str, limit: int = 200,
                      search: str | None = None) -> list[Conversation]:
        """The owner's conversations, newest first; `search` matches titles and messages."""
        if not search:
            rows = self._run("SELECT * FROM conversations WHERE owner = ? "
                             "ORDER BY updated DESC, id DESC LIMIT ?", (owner, limit)).fetchall()
        else:
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._run(
                "SELECT * FROM conversations c WHERE owner = ? AND (title LIKE ? ESCAPE '\\' "
                "OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id "
                "AND m.hidden = 0 AND m.content LIKE ? ESCAPE '\\')) "
                "ORDER BY updated DESC, id DESC LIMIT ?", (owner, like, like, limit)).fetchall()
        return [Conversation(**dict(r)) for r in rows]

    def delete_conversation(self, conversation_id: int) -> None:
        self._run("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def touch(self, conversation_id: int) -> None:
        self._run("UPDATE conversations SET updated = ? WHERE id = ?",
                  (time.time(), conversation_id))

    def rename(self, conversation_id: int, title: str) -> None:
        self._run("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_settings(self, conversation_id: int, system_prompt: str | None,
                     temperature: float | None, top_p: float | None,
                     max_tokens: int | None, enable_thinking: bool | None = None) -> None:
        thinking = None if enable_thinking is None else int(enable_thinking)
        self._run("UPDATE conversations SET system_prompt = ?, temperature = ?, top_p = ?, "
                  "max_tokens = ?, enable_thinking = ? WHERE id = ?",
                  (system_prompt, temperature, top_p, max_tokens, thinking, conversation_id))

    def set_model(self, conversation_id: int, model: str | None) -> None:
        self._run("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))

    # -- messages ----------------------------------------------------------------------
    def add_message(self, conversation_id: int, role: str, content: str,
                    status: str = "complete", request_id: str | None = None,
                    version_group: int | None = None, note: str | None = None,
                    max_tokens: int | None = None, reasoning: str | None = None,
                    model: str | None = None, images: Sequence[NewImage] = ()) -> Message:
        """A new message; its `images` are stored with it in one transaction."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cur = self._db.execute(
                    "INSERT INTO messages (conversation_id, role, content, status, "
                    "request_id, created, updated, version_group, note, max_tokens, "
                    "reasoning, model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (conversation_id, role, content, status, request_id, now, now,
                     version_group, note, max_tokens, reasoning or None, model))
                self._insert_images(conversation_id, int(cur.lastrowid or 0), images)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        self.touch(conversation_id)
        return Message(int(cur.lastrowid or 0), conversation_id, role, content, status, None,
                       None, request_id, now, max_tokens=max_tokens, note=note,
                       version_group=version_group, reasoning=reasoning or None, model=model)

    def message(self, message_id: int) -> Message | None:
        row = self._run(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?",
                        (message_id,)).fetchone()
        return Message(**dict(row)) if row else None

    def messages(self, conversation_id: int, hidden: bool = False) -> list[Message]:
        """The conversation as shown (earlier versions left out unless `hidden`)."""
        where = "" if hidden else " AND hidden = 0"
        rows = self._run(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?"
                         f"{where} ORDER BY id", (conversation_id,)).fetchall()
        return [Message(**dict(r)) for r in rows]

    def versions(self, group: int) -> list[Message]:
        """Every version of a reply, oldest first."""
        rows = self._run(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ? OR "
                         "version_group = ? ORDER BY id", (group, group)).fetchall()
        return [Message(**dict(r)) for r in rows]

    def show_version(self, message: Message) -> None:
        """Make `message` the shown version of its group (the others hidden)."""
        with self._lock:
            self._db.execute("UPDATE messages SET hidden = (id != ?) WHERE id = ? OR "
                             "version_group = ?", (message.id, message.group, message.group))

    def set_hidden(self, message_id: int, hidden: bool) -> None:
        self._run("UPDATE messages SET hidden = ? WHERE id = ?", (int(hidden), message_id))

    def edit_message(self, message_id: int, content: str) -> None:
        self._run("UPDATE messages SET content = ?, updated = ? WHERE id = ?",
                  (content, time.time(), message_id))

    def delete_after(self, conversation_id: int, message_id: int) -> None:
        """Drop every message after `message_id` (an edited question starts over from there)."""
        self._run("DELETE FROM messages WHERE conversation_id = ? AND id > ?",
                  (conversation_id, message_id))

    def save_partial(self, message_id: int, content: str, reasoning: str | None = None) -> None:
        self._run("UPDATE messages SET content = ?, reasoning = ?, updated = ? WHERE id = ?",
                  (content, reasoning or None, time.time(), message_id))

    def restart_message(self, message_id: int, max_tokens: int | None) -> None:
        """A reply that streams again (Continue): its end and figures are open again."""
        self._run("UPDATE messages SET status = 'streaming', finish_reason = NULL, error = NULL, "
                  "ended = NULL, max_tokens = ?, updated = ? WHERE id = ?",
                  (max_tokens, time.time(), message_id))

    def finish_message(self, message_id: int, content: str, status: str,
                       finish_reason: str | None, error: str | None = None,
                       ended: str | None = None,
                       figures: ReplyFigures | None = None,
                       reasoning: str | None = None) -> None:
        f = figures or ReplyFigures()
        self._run("UPDATE messages SET content = ?, status = ?, finish_reason = ?, error = ?, "
                  "ended = ?, prompt_tokens = ?, completion_tokens = ?, ttft = ?, "
                  "tokens_per_s = ?, reasoning = ?, updated = ? WHERE id = ?",
                  (content, status, finish_reason, error, ended, f.prompt_tokens,
                   f.completion_tokens, f.ttft, f.tokens_per_s, reasoning or None, time.time(),
                   message_id))

    def delete_message(self, message_id: int) -> None:
        self._run("DELETE FROM messages WHERE id = ?", (message_id,))
